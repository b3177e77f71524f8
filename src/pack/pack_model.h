// Writing a packed model (`estream pack`): a GGUF MoE model in, the packed layout of
// packed_layout.h out.
//
// Streaming: the source is read with GgufFile::ReadTensor one expert matrix at a time (open it
// with GgufOpenOptions{.mmap = false} so its pages are not mapped into the process), each expert
// is repacked into one record buffer and written through GgufWriter, dense tensors are copied
// in 8 MiB chunks. Memory: two buffers of max(one record, 8 MiB) plus one source matrix, whatever
// the model size (2 x 8 MiB + 1.2 MiB for OLMoE-1B-7B in Q4_0; 2 x 105 MiB + 31.5 MiB for
// Mixtral-8x7B in Q4_0, whose records are 105 MiB).
//
// Overlap: one extra thread writes record r (two record buffers circulate) while the calling
// thread reads and repacks record r + 1.
//
// Output: written to "<out>.tmp.<pid>" (GgufWriter), the per-record checksums are filled into
// its header once every record has been written, then the magic, then it is fsynced and renamed
// to `out`: a failure never leaves a partial file at `out` nor a temporary beside it, and an
// unfinished temporary is not a valid GGUF. `out` must be absent, a regular file or a symbolic
// link to one (which is then replaced); anything else is refused before packing starts.
//
// Sources handled: general.architecture olmoe, qwen3moe, llama (Mixtral) or deepseek2, with the merged
// blk.N.ffn_{gate,up,down}_exps.weight [n_embd, n_ff, n_expert] / [n_ff, n_embd, n_expert]
// tensors or the per-expert blk.N.ffn_{gate,up,down}.E.weight of older Mixtral files. Blocks
// without routed experts (DeepSeek's leading dense blocks) get no region, and everything that is
// not a routed expert (shared experts ffn_*_shexp, dense FFNs, MLA weights) stays a dense tensor
// of the output. Any weight
// type GGUF has: the kernels' packed layout where kernels::CanRepack, GGUF rows otherwise.
//
// Thread safety: PackModel is re-entrant (no globals). It sets the calling thread's OpenMP team
// size (omp_set_num_threads) to PackOptions.threads for its duration and restores it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"
#include "quant/types.h"

namespace estream::io {

// Per block index N, physical position -> logical expert (a permutation of 0..n_expert-1).
using ExpertPermutations = std::map<int, std::vector<int32_t>>;

struct PackProgress {
  uint64_t bytes_done = 0;   // source bytes consumed so far
  uint64_t bytes_total = 0;  // source tensor bytes in all
  double seconds = 0;        // since the start of PackModel
  int layer = -1;            // block being packed, -1 while copying dense tensors
};

struct PackOptions {
  ExpertPermutations permutations;  // blocks not listed: identity
  // Called after each record and each dense chunk (on the calling thread); may be empty.
  std::function<void(const PackProgress&)> progress;
  // OpenMP threads of the repacking (kernels::RepackWeights). One is the default: a second
  // thread gains little next to the I/O, and a team whose threads the OS does not run at the
  // same moment (a busy machine) repacks several times slower than one thread.
  int threads = 1;  // 1..kMaxThreads (estream/engine.h); InvalidArgument otherwise
};

struct PackStats {
  int layers = 0;              // regions written
  int64_t records = 0;         // expert records written (layers x n_expert)
  uint64_t input_bytes = 0;    // source file size
  uint64_t output_bytes = 0;   // packed file size
  uint64_t record_bytes = 0;   // bytes of all regions (padding included)
  uint64_t dense_bytes = 0;    // bytes of the dense tensors copied
  double seconds = 0;          // wall time of PackModel
};

// Where the experts of one MoE block of a source model are.
struct SourceExpertLayer {
  int layer = -1;
  bool per_expert = false;  // Mixtral per-expert tensors instead of merged *_exps
  // merged: one tensor per part; per_expert: n_expert tensors per part (expert order).
  std::vector<const GgufTensorInfo*> tensors[3];  // gate, up, down
  QuantType types[3] = {QuantType::kF32, QuantType::kF32, QuantType::kF32};
};

struct SourceExperts {
  std::string architecture;
  int64_t n_embd = 0;
  int64_t n_ff_expert = 0;
  int n_expert = 0;
  std::vector<SourceExpertLayer> layers;  // ascending block index
};

// Finds and checks the expert tensors of `in`. Errors: InvalidArgument when `in` is already
// packed or is not a MoE model (no {arch}.expert_count, or no expert tensors); NotSupported for
// an architecture other than olmoe, qwen3moe, llama, lfm2moe; Corruption for missing or misshapen
// expert tensors (naming the tensor); NotSupported when the experts of one block differ in type.
Result<SourceExperts> FindSourceExperts(const GgufFile& in);

// Packs `in` into `out_path`. Errors: those of FindSourceExperts; InvalidArgument for a bad
// permutation (naming the block) or when out_path is the input file; IOError naming the path
// when the output cannot be written or a source read fails.
Result<PackStats> PackModel(const GgufFile& in, const std::string& out_path, const PackOptions& options = {});

// Reads a permutation file: a JSON object whose keys are block indices and whose values are
// arrays giving, for each physical position, the logical expert stored there, e.g.
//   {"0": [3, 0, 1, 2], "7": [1, 0, 2, 3]}
// Errors: IOError (cannot read), InvalidArgument (not such an object; the message names the
// file and the key). Whether each array is a permutation of the right size is checked by
// PackModel.
Result<ExpertPermutations> ReadPermutationFile(const std::string& path);

}  // namespace estream::io
