#include "model/bpe_builder.h"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <utility>

namespace estream::synth {
namespace {

// Written for estream; any plain English works. Varied vocabulary, numbers and punctuation give
// the merges the usual shape of an English BPE (" the", "ing", " and", ...).
constexpr std::string_view kText = R"TEXT(The river town woke slowly in the early light. Fishermen pulled their boats onto the gravel,
and the baker on the corner opened his shutters at half past five, as he had done for thirty
years. Children walked to school along the old stone wall, counting the swallows that nested under
the bridge. By eight o'clock the market square was full of voices: farmers selling apples and
pears, a woman mending shoes, two students arguing about the price of coffee.

Nobody in the town remembered when the clock on the church tower had last been right. It showed
twenty past three in the morning and twenty past three in the afternoon, and visitors always
asked about it. The mayor said that a clock which is right twice a day is better than a clock
that is never right at all, and everyone laughed, because the mayor was always late.

In the spring of that year a young engineer arrived with a suitcase of drawings. She wanted to
build a small power station on the river, a wheel that would turn in the current and light the
streets at night. The council met on a Tuesday evening to discuss the plan. Some members were
worried about the fish, others about the cost, and one old farmer asked whether the light would
keep his hens awake. The engineer answered every question patiently. She explained how the water
would pass through the wheel, how the generator would store the energy, and how the wires would
run along the wall to the square. When the vote was taken, seven hands went up and three stayed
down, and the work began the following week.

Building the station took four months. The weather was kind in May and June, but in July a storm
flooded the lower fields and carried away part of the scaffolding. The workers started again,
stronger this time, with deeper posts and heavier chains. On the first evening of October the
engineer stood on the bridge and lifted her hand. The lamps came on one after another, from the
church to the harbour, and the people in the square cheered. Even the farmer admitted that his
hens were sleeping well.

Learning a new language is a little like building a bridge. At first you carry single stones:
words you can point at, such as water, bread, house and road. Later you learn how the stones fit
together, which words follow which, and why a sentence that looks correct can still sound wrong.
A good teacher does not give you the whole bridge at once. She gives you the next stone, and then
the next, and she lets you walk on what you have built so far.

Scientists measure the world with numbers. A thermometer reads 21.5 degrees, a scale shows 3.2
kilograms, and a clock counts 60 seconds in a minute and 3600 in an hour. The speed of sound in
air is about 343 metres per second, while light travels almost a million times faster. When we
write these numbers down, we also write how certain we are about them, because every measurement
has an error, and knowing the error is part of knowing the result.

A computer program is a list of instructions that a machine follows exactly. If the instructions
are clear, the program works; if they are not, the machine does what you said rather than what
you meant. Good programmers write small functions with clear names, test them carefully, and
explain in comments why the code does what it does. They read the error messages, which are
usually more helpful than they first appear, and they keep their work simple wherever they can.

The library stood at the end of the street, between the post office and the old theatre. Inside
there were long tables, green lamps and shelves that reached the ceiling. People came to read
newspapers, to borrow novels, to study for examinations, or simply to sit somewhere warm and
quiet. The librarian knew almost every visitor by name. She could find a book about birds, a map
of the mountains, or a collection of recipes from the northern islands in less than a minute.

What makes a story worth telling? Perhaps it is the moment when something changes: a door opens,
a letter arrives, a stranger walks into the room. Perhaps it is the way ordinary people behave
when they are tested, the small choices that show who they really are. Or perhaps a story is
simply a way of remembering, of keeping the voices of a town alive after the town itself has
changed beyond recognition. "I don't know," said the old man, "but I'll tell you another one."
)TEXT";

bool IsAsciiLetter(unsigned char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
// Bytes of multi-byte UTF-8 sequences count as letters, so non-ASCII words stay together.
bool IsLetter(unsigned char c) { return IsAsciiLetter(c) || c >= 0x80; }
bool IsDigit(unsigned char c) { return c >= '0' && c <= '9'; }
bool IsSpace(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

}  // namespace

std::string_view BuiltinBpeText() { return kText; }

std::string ByteToUnicode(uint8_t b) {
  // Printable bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) map to the same code point; the other 68
  // bytes map, in increasing order, to U+0100, U+0101, ...
  uint32_t cp;
  auto printable = [](int v) { return (v >= 0x21 && v <= 0x7E) || (v >= 0xA1 && v <= 0xAC) || (v >= 0xAE && v <= 0xFF); };
  if (printable(b)) {
    cp = b;
  } else {
    int n = 0;
    for (int v = 0; v < b; ++v)
      if (!printable(v)) ++n;
    cp = 0x100 + static_cast<uint32_t>(n);
  }
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {  // all code points here are < 0x800: two bytes
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

std::vector<std::string> SplitWords(std::string_view text) {
  std::vector<std::string> words;
  const size_t n = text.size();
  size_t i = 0;
  auto at = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  while (i < n) {
    const size_t start = i;
    // Contractions: 's 't 're 've 'm 'll 'd
    if (at(i) == '\'' && i + 1 < n) {
      static const char* const kSuffixes[] = {"s", "t", "re", "ve", "m", "ll", "d"};
      bool matched = false;
      for (const char* s : kSuffixes) {
        const size_t len = std::char_traits<char>::length(s);
        if (text.substr(i + 1, len) == s) {
          words.emplace_back(text.substr(i, len + 1));
          i += len + 1;
          matched = true;
          break;
        }
      }
      if (matched) continue;
    }
    // " ?letters", " ?digits", " ?other": an optional single leading space joins the run.
    size_t j = i;
    if (at(j) == ' ' && j + 1 < n && !IsSpace(at(j + 1))) ++j;
    if (!IsSpace(at(j))) {
      const unsigned char c = at(j);
      if (IsLetter(c)) {
        while (j < n && IsLetter(at(j))) ++j;
      } else if (IsDigit(c)) {
        while (j < n && IsDigit(at(j))) ++j;
      } else {
        while (j < n && !IsSpace(at(j)) && !IsLetter(at(j)) && !IsDigit(at(j))) ++j;
      }
      words.emplace_back(text.substr(start, j - start));
      i = j;
      continue;
    }
    // Whitespace: "\s+(?!\S)" leaves the last whitespace character to the next match when a
    // non-space follows (a space then joins the word; anything else stands alone).
    while (j < n && IsSpace(at(j))) ++j;
    if (j < n && j - i > 1) --j;
    words.emplace_back(text.substr(start, j - start));
    i = j;
  }
  return words;
}

Result<BpeVocab> BuildByteBpe(const BpeBuildParams& params) {
  const int n_special = static_cast<int>(params.special_tokens.size());
  if (params.vocab_size < 256 + n_special)
    return Status::InvalidArgument("BPE vocabulary size " + std::to_string(params.vocab_size) +
                                   " is too small: it needs 256 byte tokens and " +
                                   std::to_string(n_special) + " special tokens");
  BpeVocab v;
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(ByteToUnicode(static_cast<uint8_t>(b)));
    v.token_types.push_back(static_cast<int32_t>(TokenType::kNormal));
  }
  std::unordered_map<std::string, int> id_of;
  for (int b = 0; b < 256; ++b) id_of[v.tokens[b]] = b;

  // Unique words with their counts, each as a sequence of token ids (initially its bytes).
  const std::string_view text = params.text.empty() ? kText : params.text;
  std::map<std::string, int> word_counts;
  for (const std::string& w : SplitWords(text)) ++word_counts[w];
  std::vector<std::pair<std::vector<int>, int>> words;
  for (const auto& [w, count] : word_counts) {
    std::vector<int> ids;
    for (unsigned char c : w) ids.push_back(c);
    words.emplace_back(std::move(ids), count);
  }

  const int budget = std::min(params.max_merges, params.vocab_size - 256 - n_special);
  for (int m = 0; m < budget; ++m) {
    // Recount adjacent pairs (the text is small: a full recount per merge is cheap and simple).
    std::unordered_map<uint64_t, int> pairs;  // key: left id << 32 | right id
    for (const auto& [ids, count] : words)
      for (size_t k = 0; k + 1 < ids.size(); ++k)
        pairs[(static_cast<uint64_t>(ids[k]) << 32) | static_cast<uint32_t>(ids[k + 1])] += count;
    uint64_t best_key = 0;
    int best_count = 1;  // a pair must occur at least twice to be worth a token
    for (const auto& [key, count] : pairs)  // ties: the smallest key, independent of hash order
      if (count > best_count || (count == best_count && best_count > 1 && key < best_key)) {
        best_key = key;
        best_count = count;
      }
    const std::pair<int, int> best = best_count > 1 ? std::pair<int, int>{static_cast<int>(best_key >> 32),
                                                                           static_cast<int>(best_key & 0xFFFFFFFFu)}
                                                    : std::pair<int, int>{-1, -1};
    if (best.first < 0) break;
    const std::string merged = v.tokens[best.first] + v.tokens[best.second];
    v.merges.push_back(v.tokens[best.first] + " " + v.tokens[best.second]);
    int merged_id;
    auto it = id_of.find(merged);
    if (it != id_of.end()) {
      merged_id = it->second;
    } else {
      if (static_cast<int>(v.tokens.size()) >= params.vocab_size - n_special) break;
      merged_id = static_cast<int>(v.tokens.size());
      v.tokens.push_back(merged);
      v.token_types.push_back(static_cast<int32_t>(TokenType::kNormal));
      id_of[merged] = merged_id;
      ++v.n_learned;
    }
    for (auto& [ids, count] : words) {
      std::vector<int> out;
      out.reserve(ids.size());
      for (size_t k = 0; k < ids.size(); ++k) {
        if (k + 1 < ids.size() && ids[k] == best.first && ids[k + 1] == best.second) {
          out.push_back(merged_id);
          ++k;
        } else {
          out.push_back(ids[k]);
        }
      }
      ids = std::move(out);
    }
  }

  for (int s = 0; s < n_special; ++s) {
    if (id_of.count(params.special_tokens[s]))
      return Status::InvalidArgument("special token '" + params.special_tokens[s] + "' collides with a learned token");
    id_of[params.special_tokens[s]] = static_cast<int>(v.tokens.size());
    if (s == 0) v.bos_id = v.eos_id = static_cast<int32_t>(v.tokens.size());
    v.tokens.push_back(params.special_tokens[s]);
    v.token_types.push_back(static_cast<int32_t>(TokenType::kControl));
  }
  while (static_cast<int>(v.tokens.size()) < params.vocab_size) {
    v.tokens.push_back("<|pad_" + std::to_string(v.n_padding++) + "|>");
    v.token_types.push_back(static_cast<int32_t>(TokenType::kUnused));
  }
  return v;
}

}  // namespace estream::synth
