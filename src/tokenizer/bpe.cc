#include <algorithm>
#include <array>
#include <string>

#include "tokenizer/models.h"
#include "tokenizer/utf8.h"

namespace estream::tok {
namespace {

struct ByteAlphabet {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 512> from_cp{};  // every alphabet code point is below 0x144
  ByteAlphabet() {
    from_cp.fill(-1);
    uint32_t next_extra = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_cp[b] = printable ? static_cast<uint32_t>(b) : next_extra++;
      from_cp[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteAlphabet& Alphabet() {
  static const ByteAlphabet kAlphabet;
  return kAlphabet;
}

// Min-heap order on (key, left): the best candidate is the lowest key, then the leftmost.
struct CandWorse {
  bool operator()(const MergeScratch::Cand& x, const MergeScratch::Cand& y) const {
    return x.key > y.key || (x.key == y.key && x.left > y.left);
  }
};

}  // namespace

uint32_t ByteToCodepoint(uint8_t b) { return Alphabet().to_cp[b]; }

int ByteFromCodepoint(uint32_t cp) { return cp < 512 ? Alphabet().from_cp[cp] : -1; }

void AppendByteLevelDecoded(std::string_view text, std::string* out) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t n = ValidSequenceLength(text, pos);
    if (n == 0) {  // not UTF-8: copy the byte as is
      out->push_back(text[pos]);
      ++pos;
      continue;
    }
    const int b = ByteFromCodepoint(DecodeAt(text, pos, n));
    if (b >= 0) out->push_back(static_cast<char>(b));
    else out->append(text.data() + pos, n);
    pos += n;
  }
}

// Open-addressing hash table (linear probing) from a symbol pair to (rank, merged symbol).
struct BpeModel::PairTable {
  struct Slot {
    uint64_t key = kEmpty;
    int32_t rank = 0;
    int32_t merged = 0;
  };
  static constexpr uint64_t kEmpty = ~0ull;
  std::vector<Slot> slots;
  uint64_t mask = 0;

  explicit PairTable(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;  // load factor <= 0.5
    slots.resize(cap);
    mask = cap - 1;
  }
  static uint64_t Key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  size_t Home(uint64_t key) const { return ((key * 0x9E3779B97F4A7C15ull) >> 20) & mask; }
  // Inserts unless present (the first, lowest-ranked occurrence of a duplicate merge wins).
  void Insert(uint64_t key, int32_t rank, int32_t merged) {
    for (size_t i = Home(key);; i = (i + 1) & mask) {
      if (slots[i].key == key) return;
      if (slots[i].key == kEmpty) {
        slots[i] = {key, rank, merged};
        return;
      }
    }
  }
  const Slot* Find(uint64_t key) const {
    for (size_t i = Home(key);; i = (i + 1) & mask) {
      if (slots[i].key == key) return &slots[i];
      if (slots[i].key == kEmpty) return nullptr;
    }
  }
};

BpeModel::~BpeModel() = default;

Result<std::unique_ptr<BpeModel>> BpeModel::Create(const std::vector<std::string>& tokens,
                                                   const TokenIndex& index,
                                                   const std::vector<std::string>& merges,
                                                   bool ignore_merges, const std::string& source) {
  std::unique_ptr<BpeModel> m(new BpeModel());
  m->n_vocab_ = static_cast<int32_t>(tokens.size());
  m->ignore_merges_ = ignore_merges;
  m->index_ = &index;
  std::unordered_map<std::string, int32_t> synthetic_index;
  auto symbol_of = [&](std::string_view text) -> int32_t {
    auto it = index.find(text);
    if (it != index.end()) return it->second;
    auto [sit, inserted] = synthetic_index.emplace(std::string(text), 0);
    if (inserted) {
      sit->second = m->n_vocab_ + static_cast<int32_t>(m->synthetic_.size());
      m->synthetic_.emplace_back(text);
    }
    return sit->second;
  };
  for (int b = 0; b < 256; ++b) {
    AppendUtf8(ByteToCodepoint(static_cast<uint8_t>(b)), &m->byte_string_[b]);
    m->byte_symbol_[b] = symbol_of(m->byte_string_[b]);
  }
  m->pairs_ = std::make_unique<PairTable>(merges.size());
  std::string joined;
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& merge = merges[i];
    // Split at the first space after the first character (a left part never starts with one).
    const size_t sp = merge.size() > 1 ? merge.find(' ', 1) : std::string::npos;
    if (sp == std::string::npos || sp + 1 >= merge.size())
      return Status::Corruption(source + ": tokenizer.ggml.merges[" + std::to_string(i) + "] = '" +
                                merge + "' is not 'left right'; the file is damaged, re-convert it");
    const std::string_view left(merge.data(), sp);
    const std::string_view right(merge.data() + sp + 1, merge.size() - sp - 1);
    joined.assign(left);
    joined.append(right);
    const int32_t a = symbol_of(left);
    const int32_t b = symbol_of(right);
    const int32_t merged = symbol_of(joined);
    m->pairs_->Insert(PairTable::Key(a, b), static_cast<int32_t>(i), merged);
  }
  return m;
}

void BpeModel::EncodeWord(std::string_view word, MergeScratch* s, std::vector<int32_t>* out) const {
  const auto* bytes = reinterpret_cast<const uint8_t*>(word.data());
  const int32_t n = static_cast<int32_t>(word.size());
  if (ignore_merges_) {
    s->mapped.clear();
    for (int32_t i = 0; i < n; ++i) s->mapped += byte_string_[bytes[i]];
    auto it = index_->find(s->mapped);
    if (it != index_->end()) {
      out->push_back(it->second);
      return;
    }
  }
  std::vector<int32_t>& sym = s->sym;
  std::vector<int32_t>& prev = s->prev;
  std::vector<int32_t>& next = s->next;
  sym.resize(n);
  prev.resize(n);
  next.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    sym[i] = byte_symbol_[bytes[i]];
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  auto& heap = s->heap;
  heap.clear();
  const PairTable& pairs = *pairs_;
  auto try_push = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const PairTable::Slot* slot = pairs.Find(PairTable::Key(sym[left], sym[right]));
    if (slot == nullptr) return;
    heap.push_back({static_cast<float>(slot->rank), left, sym[left], sym[right], slot->merged});
    std::push_heap(heap.begin(), heap.end(), CandWorse());
  };
  for (int32_t i = 0; i + 1 < n; ++i) try_push(i, i + 1);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), CandWorse());
    const MergeScratch::Cand c = heap.back();
    heap.pop_back();
    const int32_t left = c.left;
    // Stale unless the left symbol and its current right neighbour are the pair that was pushed.
    if (sym[left] != c.a) continue;
    const int32_t right = next[left];
    if (right < 0 || sym[right] != c.b) continue;
    sym[left] = c.c;
    sym[right] = -1;
    next[left] = next[right];
    if (next[right] >= 0) prev[next[right]] = left;
    try_push(prev[left], left);
    try_push(left, next[left]);
  }
  for (int32_t i = 0; i >= 0; i = next[i]) {
    const int32_t id = sym[i];
    if (id < n_vocab_) {
      out->push_back(id);
      continue;
    }
    // Not a vocabulary entry: emit the tokens of its single bytes where they exist.
    const std::string& text = synthetic_[static_cast<size_t>(id - n_vocab_)];
    for (char ch : text) {
      auto it = index_->find(std::string_view(&ch, 1));
      if (it != index_->end()) out->push_back(it->second);
    }
  }
}

}  // namespace estream::tok
