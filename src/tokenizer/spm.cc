#include <algorithm>
#include <cstdio>

#include "tokenizer/models.h"
#include "tokenizer/utf8.h"

namespace estream::tok {
namespace {

struct CandWorse {
  bool operator()(const MergeScratch::Cand& x, const MergeScratch::Cand& y) const {
    return x.key > y.key || (x.key == y.key && x.left > y.left);
  }
};

}  // namespace

std::unique_ptr<SpmModel> SpmModel::Create(const std::vector<std::string>& tokens,
                                           const std::vector<float>& scores,
                                           const TokenIndex& index, int32_t unk_id) {
  std::unique_ptr<SpmModel> m(new SpmModel());
  m->index_ = &index;
  m->scores_ = scores;
  m->split_at_space_ = true;
  for (const std::string& t : tokens) {
    m->max_token_len_ = std::max(m->max_token_len_, t.size());
    // A "▁" preceded by something other than "▁" would let a merge cross a word start.
    for (size_t p = t.find("\xE2\x96\x81", 1); p != std::string::npos; p = t.find("\xE2\x96\x81", p + 1)) {
      if (p < 3 || t.compare(p - 3, 3, "\xE2\x96\x81") != 0) m->split_at_space_ = false;
    }
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = index.find(name);
    if (it == index.end()) {
      // Some vocabularies store the raw byte instead of "<0xXX>".
      const char raw = static_cast<char>(b);
      it = index.find(std::string_view(&raw, 1));
    }
    m->byte_token_[b] = it != index.end() ? it->second : unk_id;
  }
  return m;
}

void SpmModel::EncodeText(std::string_view text, MergeScratch* s, WordCache* cache,
                          std::vector<int32_t>* out) const {
  auto encode = [&](std::string_view word, std::vector<int32_t>* o) { EncodeWord(word, s, o); };
  if (!split_at_space_) {
    EncodeWord(text, s, out);
    return;
  }
  constexpr std::string_view kMark = "\xE2\x96\x81";
  size_t begin = 0;
  for (size_t p = text.find(kMark, 1); p != std::string_view::npos; p = text.find(kMark, p + 3)) {
    if (p >= 3 && text.compare(p - 3, 3, kMark) == 0) continue;  // inside a run of spaces
    cache->Encode(text.substr(begin, p - begin), out, encode);
    begin = p;
  }
  cache->Encode(text.substr(begin), out, encode);
}

void SpmModel::EncodeWord(std::string_view text, MergeScratch* s, std::vector<int32_t>* out) const {
  if (text.empty()) return;
  std::vector<int32_t>& start = s->start;
  std::vector<int32_t>& len = s->len;
  std::vector<int32_t>& prev = s->prev;
  std::vector<int32_t>& next = s->next;
  start.clear();
  len.clear();
  // One symbol per UTF-8 character (the input is well-formed).
  for (size_t pos = 0; pos < text.size();) {
    const size_t n = std::min(LeadByteLength(static_cast<uint8_t>(text[pos])), text.size() - pos);
    start.push_back(static_cast<int32_t>(pos));
    len.push_back(static_cast<int32_t>(n));
    pos += n;
  }
  const int32_t n_sym = static_cast<int32_t>(start.size());
  prev.resize(n_sym);
  next.resize(n_sym);
  for (int32_t i = 0; i < n_sym; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n_sym ? i + 1 : -1;
  }
  auto& heap = s->heap;
  heap.clear();
  auto try_push = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const size_t merged_len = static_cast<size_t>(len[left] + len[right]);
    if (merged_len > max_token_len_) return;
    auto it = index_->find(text.substr(static_cast<size_t>(start[left]), merged_len));
    if (it == index_->end()) return;
    // Highest score first: key = -score so the min-heap order applies.
    heap.push_back({-scores_[static_cast<size_t>(it->second)], left, 0,
                    static_cast<int32_t>(merged_len), 0});
    std::push_heap(heap.begin(), heap.end(), CandWorse());
  };
  for (int32_t i = 0; i + 1 < n_sym; ++i) try_push(i, i + 1);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), CandWorse());
    const MergeScratch::Cand c = heap.back();
    heap.pop_back();
    const int32_t left = c.left;
    const int32_t right = next[left];
    // Stale when either side was merged since the push (their lengths no longer add up).
    if (len[left] == 0 || right < 0 || len[left] + len[right] != c.b) continue;
    len[left] += len[right];
    len[right] = 0;
    next[left] = next[right];
    if (next[right] >= 0) prev[next[right]] = left;
    try_push(prev[left], left);
    try_push(left, next[left]);
  }
  for (int32_t i = 0; i >= 0; i = next[i]) {
    const std::string_view piece = text.substr(static_cast<size_t>(start[i]),
                                               static_cast<size_t>(len[i]));
    auto it = index_->find(piece);
    if (it != index_->end()) {
      out->push_back(it->second);
      continue;
    }
    // A character no token covers: its bytes as byte tokens.
    for (char ch : piece) {
      const int32_t id = byte_token_[static_cast<uint8_t>(ch)];
      if (id >= 0) out->push_back(id);
    }
  }
}

}  // namespace estream::tok
