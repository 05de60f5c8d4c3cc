// Fused nested-gear mat-vec: out[m, o] = sum_k x[m, k] * (sum_p dequant(plane_p)[o, k]) (+ bias[o]),
// for decode (one row of x, or a few). Each plane is standard MLX affine quantization: a uint32
// weight (out_dims, in_dims * BITS / 32), scales and biases (out_dims, in_dims / GROUP_SIZE), and
// w = scale * q + bias within a group. x is read once per chunk and feeds every plane and output
// row in registers; the planes are summed in fp32 and the output is rounded once (the reference,
// a sum of quantized_matmul calls, rounds each plane's product to the output dtype first).
//
// Layout of the work:
//   - a SIMD group owns RESULTS consecutive output rows; a threadgroup holds
//     threads_per_threadgroup.x / 32 SIMD groups; grid y walks the row blocks, grid z the rows of x;
//   - lane l takes the chunks of 8 inputs l, l + 32, l + 64, ... (adjacent lanes read adjacent
//     memory); 8 inputs always lie in one group (group sizes are multiples of 8);
//   - per chunk and plane: acc += scale * dot(x, q) + bias * sum(x), the affine identity
//     sum_k x_k (s q_k + b) = s sum_k x_k q_k + b sum_k x_k;
//   - simd_sum folds the 32 lanes; lane 0 adds the bias and writes.
//
// Packing (checked against mx.quantize for 2, 3, 4, 5, 6 and 8 bits): a row's codes form one
// little-endian bitstream, code k at bits [k * BITS, (k + 1) * BITS). So a chunk of 8 codes is
// 8 * BITS bits starting on a byte boundary; it spans at most two uint32 words (the widest case,
// 5 bits at byte offset 3, ends exactly at bit 64), read as one 64-bit value.
//
// The host (mlxswitch/kernels/nested.py) replaces the markers in the body: one plane line per
// active plane (inputs w{p}, scales{p}, biases{p}, template BITS{p}), and the bias line when
// the layer has a bias (input `bias`).

// ---- header ----
// The 8 codes of `chunk` in the row whose first word is `word0`, in the low 8 * BITS bits.
template <int BITS, typename WP>
inline ulong nested_chunk_codes(WP w, uint word0, uint chunk) {
  const uint bit = chunk * 8u * uint(BITS);
  const uint word = word0 + bit / 32u;
  const uint shift = bit % 32u;
  ulong v = ulong(w[word]);
  // Read the next word only when the chunk reaches into it: the last chunk of the last row
  // may end exactly at the end of the buffer.
  if (shift + 8u * uint(BITS) > 32u) {
    v |= ulong(w[word + 1u]) << 32;
  }
  return v >> shift;
}

// Adds one plane's contribution of one chunk to the RESULTS output rows from row0. Pointer types
// are template parameters: MLX declares small inputs `constant` and larger ones `device`.
template <int BITS, int GROUP_SIZE, int RESULTS, typename WP, typename SP, typename BP>
inline void nested_plane_accumulate(WP w, SP scales, BP biases, thread const float* xs,
                                    float xsum, uint row0, uint out_dims, uint in_dims,
                                    uint chunk, thread float* acc) {
  const uint row_words = in_dims * uint(BITS) / 32u;
  const uint groups = in_dims / uint(GROUP_SIZE);
  const uint group = chunk * 8u / uint(GROUP_SIZE);
  const ulong mask = ulong((1u << BITS) - 1u);
  for (int r = 0; r < RESULTS; ++r) {
    // Rows past the end (the last block) recompute the last row and are never written; keeping
    // every lane busy keeps simd_sum uniform and every read in bounds.
    const uint row = metal::min(row0 + uint(r), out_dims - 1u);
    const ulong codes = nested_chunk_codes<BITS>(w, row * row_words, chunk);
    float dot = 0.0f;
    for (int j = 0; j < 8; ++j) {
      dot += xs[j] * float((codes >> (j * BITS)) & mask);
    }
    const uint g = row * groups + group;
    acc[r] += float(scales[g]) * dot + float(biases[g]) * xsum;
  }
}

// ---- body ----
const uint lane = thread_index_in_simdgroup;
const uint in_dims = uint(x_shape[1]);
const uint out_dims = uint(scales0_shape[0]);
const uint row_in = thread_position_in_grid.z;
const uint simds = threads_per_threadgroup.x / 32u;
const uint row0 = (thread_position_in_grid.y * simds + simdgroup_index_in_threadgroup) * uint(RESULTS);

float acc[RESULTS];
for (int r = 0; r < RESULTS; ++r) {
  acc[r] = 0.0f;
}
const uint chunks = in_dims / 8u;
for (uint chunk = lane; chunk < chunks; chunk += 32u) {
  float xs[8];
  float xsum = 0.0f;
  const uint base = row_in * in_dims + chunk * 8u;
  for (int j = 0; j < 8; ++j) {
    xs[j] = float(x[base + j]);
    xsum += xs[j];
  }
  /*PLANES*/
}
for (int r = 0; r < RESULTS; ++r) {
  float total = simd_sum(acc[r]);
  const uint row = row0 + uint(r);
  if (lane == 0 && row < out_dims) {
    /*BIAS*/
    out[row_in * out_dims + row] = static_cast<T>(total);
  }
}

// ---- plane ----
nested_plane_accumulate<BITS{p}, GROUP_SIZE, RESULTS>(w{p}, scales{p}, biases{p}, xs, xsum, row0, out_dims, in_dims, chunk, acc);

// ---- bias ----
total += float(bias[row]);
