// Fused next-token signals over one logits vector: entropy (bits), varentropy (bits^2) and the
// top-1 minus top-2 probability margin, read in one pass by one threadgroup, reduced in fp32.
//
// Each thread streams over logits[tid], logits[tid + n], ... keeping softmax statistics relative
// to the largest logit it has seen, t1 (online softmax: rescaled whenever t1 grows):
//   s = sum e^d,  s1 = sum e^d * d,  s2 = sum e^d * d^2,   d = x - t1,   t2 = second largest logit.
// With p_i = e^(x_i) / Z and -log p_i = log Z - x_i:
//   H   = sum p_i (log Z - x_i) = log Z - E[x]        (nats)
//       = log s - s1 / s                              since Z = e^t1 * s and E[x] = t1 + s1 / s
//   var = Var[-log p] = Var[x] = s2 / s - (s1 / s)^2  (nats^2; d = x - t1 is x shifted)
//   p1 - p2 = (e^0 - e^(t2 - t1)) / s
// Bits: divide by ln 2 (varentropy by ln^2 2).
//
// Why one threadgroup: a vocabulary is at most ~600 KB of logits, one dispatch reads it once
// (~150 elements a thread at 1024 threads) and the result needs no second kernel or device-wide
// atomics. Two-pass multi-threadgroup would spread the read over more GPU cores but costs a
// second dispatch and an intermediate buffer for a job that is microseconds either way.
//
// Special values (the kernel is built with math_mode "safe": IEEE inf/NaN are honoured):
//   -inf (a masked token) has probability 0 and is skipped; NaN or +inf sets `bad`, and a bad
//   or fully masked vector yields NaN for all three signals (the router's catastrophic guard).

// ---- header ----
struct TokenSignalStats {
  float t1;   // largest logit so far (the reference point of s, s1, s2); -inf when empty
  float t2;   // second largest logit so far; -inf when fewer than two
  float s;
  float s1;
  float s2;
  uint bad;   // 1 once a NaN or +inf logit was seen
};

inline TokenSignalStats token_signal_stats_empty() {
  TokenSignalStats st;
  st.t1 = -INFINITY;
  st.t2 = -INFINITY;
  st.s = 0.0f;
  st.s1 = 0.0f;
  st.s2 = 0.0f;
  st.bad = 0;
  return st;
}

// Re-express s, s1, s2 relative to a reference t >= st.t1. With c = st.t1 - t <= 0, every d
// becomes d + c:  s' = e^c s,  s1' = e^c (s1 + c s),  s2' = e^c (s2 + 2c s1 + c^2 s).
// When e^c underflows (c < -128, or c = -inf/NaN for an empty state) the statistics are 0;
// testing that first keeps c^2 from overflowing into 0 * inf = NaN.
inline void token_signal_rebase(thread TokenSignalStats& st, float t) {
  float c = st.t1 - t;
  if (c > -128.0f) {
    float r = metal::exp(c);
    st.s2 = r * (st.s2 + c * (2.0f * st.s1 + c * st.s));
    st.s1 = r * (st.s1 + c * st.s);
    st.s = r * st.s;
  } else {
    st.s = 0.0f;
    st.s1 = 0.0f;
    st.s2 = 0.0f;
  }
}

// Combine the 32 lanes' statistics; every lane gets the SIMD group's result. Must be called by
// all lanes of the SIMD group together (no divergence around it).
inline TokenSignalStats token_signal_simd_combine(TokenSignalStats st, uint lane) {
  TokenSignalStats out;
  out.t1 = simd_max(st.t1);
  // The second largest logit is the largest of the other lanes' t1 and the top lane's own t2
  // (ties: another lane with t1 equal to the maximum makes t2 equal to it, margin 0).
  uint top_lane = simd_min(st.t1 == out.t1 ? lane : 32u);
  out.t2 = simd_max(lane == top_lane ? st.t2 : st.t1);
  token_signal_rebase(st, out.t1);
  out.s = simd_sum(st.s);
  out.s1 = simd_sum(st.s1);
  out.s2 = simd_sum(st.s2);
  out.bad = simd_max(st.bad);
  return out;
}

// ---- body ----
// Per-SIMD-group partial statistics (at most 1024 / 32 groups). Scalars, not structs, so that
// no struct copy crosses address spaces.
threadgroup float part_t1[32];
threadgroup float part_t2[32];
threadgroup float part_s[32];
threadgroup float part_s1[32];
threadgroup float part_s2[32];
threadgroup uint part_bad[32];

const uint tid = thread_position_in_threadgroup.x;
const uint nthreads = threads_per_threadgroup.x;
const uint lane = thread_index_in_simdgroup;
const uint group = simdgroup_index_in_threadgroup;
const uint vocab = uint(logits_shape[0]);

TokenSignalStats st = token_signal_stats_empty();
// Strided so that a SIMD group reads 32 consecutive logits (coalesced); any vocab size works,
// threads past the end simply keep an empty state.
for (uint i = tid; i < vocab; i += nthreads) {
  const T raw = logits[i];
  const float x = static_cast<float>(raw);
  if (x == -INFINITY) {
    continue;
  }
  if (metal::isnan(x) || x == INFINITY) {
    st.bad = 1;
    continue;
  }
  if (x > st.t1) {
    token_signal_rebase(st, x);
    st.t2 = st.t1;
    st.t1 = x;
  } else if (x > st.t2) {
    st.t2 = x;
  }
  const float d = x - st.t1;
  const float e = metal::exp(d);
  // (e * d) * d, never e * (d * d): d * d may overflow where e is already 0.
  const float ed = e * d;
  st.s += e;
  st.s1 += ed;
  st.s2 += ed * d;
}

st = token_signal_simd_combine(st, lane);
if (lane == 0) {
  part_t1[group] = st.t1;
  part_t2[group] = st.t2;
  part_s[group] = st.s;
  part_s1[group] = st.s1;
  part_s2[group] = st.s2;
  part_bad[group] = st.bad;
}
threadgroup_barrier(mem_flags::mem_threadgroup);

if (group == 0) {
  const uint groups = (nthreads + 31) / 32;
  TokenSignalStats total = token_signal_stats_empty();
  if (lane < groups) {
    total.t1 = part_t1[lane];
    total.t2 = part_t2[lane];
    total.s = part_s[lane];
    total.s1 = part_s1[lane];
    total.s2 = part_s2[lane];
    total.bad = part_bad[lane];
  }
  total = token_signal_simd_combine(total, lane);
  if (lane == 0) {
    const float ln2 = 0.693147180559945309f;
    if (total.bad != 0 || !(total.s > 0.0f)) {
      out[0] = NAN;
      out[1] = NAN;
      out[2] = NAN;
    } else {
      const float mean_d = total.s1 / total.s;
      out[0] = (metal::log(total.s) - mean_d) / ln2;
      out[1] = metal::max(total.s2 / total.s - mean_d * mean_d, 0.0f) / (ln2 * ln2);
      out[2] = (1.0f - metal::exp(total.t2 - total.t1)) / total.s;
    }
  }
}
