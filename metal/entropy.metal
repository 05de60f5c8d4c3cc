// Fused next-token signals over one logits vector, in one pass, by one threadgroup.
// Every thread keeps online softmax statistics relative to its running max m:
//   s = Σ e^(x-m),  s1 = Σ e^(x-m)·(x-m),  s2 = Σ e^(x-m)·(x-m)²,  plus the two largest logits.
// Then, with d = x - m:  H = log Z - E[x] = log s - s1/s   (nats),
//                        varentropy = E[d²] - E[d]² = s2/s - (s1/s)²,
//                        margin p1 - p2 = (1 - e^(t2 - m)) / s   (t1 = m).
// Partial states merge by shifting both to the larger max (shift c = m_old - m_new ≤ 0):
//   s2' = e^c (s2 + 2c·s1 + c²·s),  s1' = e^c (s1 + c·s),  s' = e^c s.
// One threadgroup keeps it to a single dispatch; the vector (≤ 600 KB) is read once.

// ---- header ----
struct SignalStats {
  float m;
  float s;
  float s1;
  float s2;
  float t1;
  float t2;
  uint bad;
};

inline SignalStats signal_stats_empty() {
  SignalStats st;
  st.m = -INFINITY; st.s = 0.0f; st.s1 = 0.0f; st.s2 = 0.0f;
  st.t1 = -INFINITY; st.t2 = -INFINITY; st.bad = 0;
  return st;
}

inline void signal_stats_shift(thread SignalStats& st, float new_m) {
  if (st.m == -INFINITY) {  // nothing accumulated yet: avoid (-inf) * 0
    st.s = 0.0f; st.s1 = 0.0f; st.s2 = 0.0f;
  } else {
    float c = st.m - new_m;
    float r = metal::exp(c);
    st.s2 = r * (st.s2 + 2.0f * c * st.s1 + c * c * st.s);
    st.s1 = r * (st.s1 + c * st.s);
    st.s = r * st.s;
  }
  st.m = new_m;
}

inline SignalStats signal_stats_merge(SignalStats a, SignalStats b) {
  float m = metal::max(a.m, b.m);
  SignalStats out = signal_stats_empty();
  if (m == -INFINITY) {
    out.bad = a.bad | b.bad;
    return out;
  }
  signal_stats_shift(a, m);
  signal_stats_shift(b, m);
  out.m = m;
  out.s = a.s + b.s;
  out.s1 = a.s1 + b.s1;
  out.s2 = a.s2 + b.s2;
  out.t1 = metal::max(a.t1, b.t1);
  out.t2 = metal::max(metal::min(a.t1, b.t1), metal::max(a.t2, b.t2));
  out.bad = a.bad | b.bad;
  return out;
}

inline SignalStats signal_stats_shuffle_down(SignalStats st, ushort delta) {
  SignalStats o;
  o.m = simd_shuffle_down(st.m, delta);
  o.s = simd_shuffle_down(st.s, delta);
  o.s1 = simd_shuffle_down(st.s1, delta);
  o.s2 = simd_shuffle_down(st.s2, delta);
  o.t1 = simd_shuffle_down(st.t1, delta);
  o.t2 = simd_shuffle_down(st.t2, delta);
  o.bad = simd_shuffle_down(st.bad, delta);
  return o;
}

inline SignalStats signal_stats_simd_reduce(SignalStats st) {
  // Tree reduction towards lane 0; other lanes end up with partial garbage, never read.
  for (ushort delta = 16; delta > 0; delta >>= 1) {
    st = signal_stats_merge(st, signal_stats_shuffle_down(st, delta));
  }
  return st;
}

// ---- body ----
threadgroup SignalStats partials[32];
uint tid = thread_position_in_threadgroup.x;
uint nthreads = threads_per_threadgroup.x;
uint lane = thread_index_in_simdgroup;
uint group = simdgroup_index_in_threadgroup;
uint vocab = logits_shape[0];

SignalStats st = signal_stats_empty();
for (uint i = tid; i < vocab; i += nthreads) {
  float x = static_cast<float>(logits[i]);
  if (metal::isnan(x)) { st.bad = 1; continue; }
  if (x == -INFINITY) { continue; }  // a masked token has probability 0
  if (x > st.t1) { st.t2 = st.t1; st.t1 = x; } else if (x > st.t2) { st.t2 = x; }
  if (x > st.m) { signal_stats_shift(st, x); }
  float d = x - st.m;
  float e = metal::exp(d);
  st.s += e;
  st.s1 += e * d;
  st.s2 += e * d * d;
}

st = signal_stats_simd_reduce(st);
if (lane == 0) { partials[group] = st; }
threadgroup_barrier(mem_flags::mem_threadgroup);

if (group == 0) {
  uint groups = (nthreads + 31) / 32;
  st = lane < groups ? partials[lane] : signal_stats_empty();
  st = signal_stats_simd_reduce(st);
  if (lane == 0) {
    const float ln2 = 0.69314718055994530942f;
    if (st.bad != 0 || st.s <= 0.0f) {
      out[0] = NAN; out[1] = NAN; out[2] = NAN;
    } else {
      float mean_d = st.s1 / st.s;
      float h = metal::log(st.s) - mean_d;
      float var = metal::max(st.s2 / st.s - mean_d * mean_d, 0.0f);
      float p2 = st.t2 == -INFINITY ? 0.0f : metal::exp(st.t2 - st.m);
      out[0] = h / ln2;
      out[1] = var / (ln2 * ln2);
      out[2] = (1.0f - p2) / st.s;
    }
  }
}
