#include "profiler/calibration.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <sstream>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace estream::profiler {
namespace {

// Original prose written for estream (not taken from any corpus). Topics, numbers, a letter,
// meeting notes, a recipe, Python and C code, chess notation: the router of a real model then
// sees a spread of token kinds, as in ordinary prompts.
constexpr std::string_view kText = R"estream_calib(
The harbour town woke slowly on the first Tuesday of March. Fishing boats had left at 4:30, long before the bakery on Quay Street lit its ovens, and by seven the tide was already turning. Marta counted the crates twice: 112 of cod, 37 of mackerel, and a single crate of something nobody could name, silver and thin as a letter opener. "Put it on ice," said her brother, "and ask the university. They love a mystery."

Weather records kept at the lighthouse since 1887 show that spring storms have grown neither more frequent nor much stronger, but they arrive later in the season than they used to. The keepers wrote everything down in pencil: wind direction, barometric pressure (usually between 980 and 1040 hectopascals), the colour of the sea at noon. Their notebooks fill eleven shelves. A volunteer spent three winters typing them into a spreadsheet, and found that the average date of the last gale had moved by nine days per century.

In the kitchen, bread is mostly patience. Mix 500 g of flour with 350 ml of water and 10 g of salt; add a spoonful of starter, fold the dough every half hour for two hours, then leave it in a cool place overnight. The next morning, shape it gently, let it rise until it springs back slowly when pressed, and bake it at 230 degrees Celsius for 40 minutes, the first 20 with a lid. If the crust is pale, the oven was too cool; if the crumb is dense and gummy, the dough needed more time, not more yeast.

A small program can check whether a number is prime by trying every divisor up to its square root:

    def is_prime(n):
        if n < 2:
            return False
        d = 2
        while d * d <= n:
            if n % d == 0:
                return False
            d += 1
        return True

    print([n for n in range(50) if is_prime(n)])

The output begins 2, 3, 5, 7, 11, 13 and ends with 47. For large numbers one uses faster tests; for a list of fifty, the simple loop finishes in microseconds. In C the same idea reads `for (long d = 2; d * d <= n; ++d) if (n % d == 0) return 0;` and compiles to a handful of instructions.

Economists at the regional office estimated that the new rail link would cut the journey between the two cities from 2 hours 45 minutes to 1 hour 20 minutes, and that about 14,000 people would use it each weekday by 2030. Critics replied that the estimate assumed fares of 12.50 per trip, while the operator had hinted at 18. Both sides agreed on one thing: the old line, built in 1912, could not carry faster trains without replacing most of its bridges.

Bees do not see red, but they see ultraviolet, so a flower that looks plain yellow to us may carry dark guide lines pointing to its nectar. A worker bee visits several hundred flowers on a good day and flies up to three kilometres from the hive. When she returns, she dances: the angle of the waggle run against the vertical tells the others the direction of the food relative to the sun, and its duration tells them the distance. Researchers decoded this in the 1940s by watching glass-walled hives for months.

Chess openings have names that sound like places in a novel: the Sicilian, the French, the Catalan, the Queen's Gambit. After 1. e4 c5 2. Nf3 d6 3. d4 cxd4 4. Nxd4 Nf6 5. Nc3 a6, the position is called the Najdorf, and strong players have studied it for more than seventy years without exhausting it. A beginner gains more by learning to spot loose pieces than by memorising twenty moves of theory.

Dear Sam, thank you for the photographs of the garden. The tomatoes look wonderful, although I suspect the snails have found the lettuce again! We are well here; the roof repair finally finished on Friday (three weeks late, and 20% over the quote, as you predicted). Give my regards to Priya and tell her the book she lent me was the best thing I read all winter. Write soon -- Ellen.

Light travels about 299,792 kilometres per second in a vacuum, so sunlight takes roughly eight minutes and twenty seconds to reach the Earth. The Moon is close enough that a laser pulse sent from a telescope, reflected by the mirrors left on its surface, comes back in about 2.5 seconds. Measuring that delay to within a few picoseconds tells us the distance to within millimetres, and shows that the Moon drifts away by about 3.8 centimetres every year.

Meeting notes, 9 May. Present: Ana, Bruno, Chen, Dmitri. 1) The backup job failed twice last week because the disk was 97% full; Bruno will move the old archives to cold storage by Monday. 2) Customer tickets are down 11% since the new help page went live. 3) Budget: travel is frozen until July; training is not. 4) Next meeting on the 23rd, same room. Action items are in the shared folder under /projects/ops/2024-05.

The old clockmaker kept a rule on the wall of his workshop: never oil a clock you have not first cleaned. Oil on dirt makes a grinding paste, he said, and a movement that might have run for fifty more years wears out in five. He charged by the hour, wrote his invoices by hand, and refused to repair anything with a battery. Customers waited months and rarely complained.

Consider a table of temperatures: Monday 14.2, Tuesday 15.8, Wednesday 13.1, Thursday 17.4, Friday 18.9. The mean is 15.88 degrees and the median is 15.8; the difference between the warmest and coldest day is 5.8 degrees. With only five values, one unusual day moves the mean noticeably, which is why weather services prefer averages over thirty years when they speak of a "normal" season.

Rivers shape the land they cross. On steep ground they cut narrow valleys and carry stones the size of cars during floods; on flat plains they slow down, drop their sand and silt, and wander in loops that slowly migrate downstream. Sometimes a loop is cut off entirely and becomes a quiet, crescent-shaped lake. Maps drawn a century apart can show the same river in two quite different places.

The children's question was simple: why is the sky blue? The answer takes a little longer. Sunlight contains every colour; air molecules scatter short wavelengths, the blues and violets, much more strongly than long ones, so blue light reaches our eyes from every direction of the sky. At sunset the light crosses far more air, most of the blue is scattered away before it arrives, and the remaining reds and oranges colour the clouds.

Finally, a short list of things worth remembering: back up your files before you need to; measure twice and cut once; read the error message to the end; label the freezer bags; and when a plan depends on everything going right, make a second plan.
)estream_calib";

}  // namespace

std::string_view BuiltinCalibrationText() { return kText.substr(1); }  // without the leading '\n'

Result<std::vector<int32_t>> CalibrationTokens(const std::string& model_path, const std::string& calib_path,
                                               int max_tokens) {
  if (max_tokens < 1) {
    return Status::InvalidArgument(fmt::format("calibration: --calib-tokens must be >= 1 (got {})", max_tokens));
  }
  auto file = GgufFile::Open(model_path);
  if (!file.ok()) {
    return Status::InvalidArgument(fmt::format("calibration: cannot read the model: {}", file.status().message()));
  }
  auto tok = Tokenizer::FromGguf(**file);
  if (!tok.ok()) {
    return Status::InvalidArgument(fmt::format("calibration: {}: the model has no usable tokenizer ({}); the "
                                               "calibration request needs one to tokenize its text",
                                               model_path, tok.status().message()));
  }

  std::string owned;
  std::string_view text = BuiltinCalibrationText();
  if (!calib_path.empty()) {
    std::ifstream in(calib_path, std::ios::binary);
    if (!in) {
      return Status::InvalidArgument(fmt::format("calibration: cannot read --calib file '{}'", calib_path));
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) {
      return Status::InvalidArgument(fmt::format("calibration: error reading --calib file '{}'", calib_path));
    }
    owned = std::move(ss).str();
    text = owned;
  }
  const std::string source = calib_path.empty() ? std::string("the built-in calibration text") : "'" + calib_path + "'";

  const std::vector<int32_t> body = (*tok)->Encode(text, /*add_special=*/false, /*parse_special=*/false);
  if (body.empty()) {
    return Status::InvalidArgument(
        fmt::format("calibration: {} gives no tokens with the tokenizer of {} (empty text?)", source, model_path));
  }

  // Context length: {arch}.context_length when the model states it (vocab-only files do not).
  uint64_t n_ctx = 0;
  if (auto arch = (*file)->GetString("general.architecture"); arch.ok()) {
    if (auto c = (*file)->GetU64(*arch + ".context_length"); c.ok()) n_ctx = *c;
  }
  size_t limit = static_cast<size_t>(max_tokens);
  if (n_ctx > 0) limit = std::min<size_t>(limit, n_ctx);

  std::vector<int32_t> ids;
  ids.reserve(limit);
  if ((*tok)->add_bos() && (*tok)->bos_id() >= 0) ids.push_back((*tok)->bos_id());
  // Repeat the text's tokens (no BOS between repeats: one request, one document start).
  while (ids.size() < limit) {
    const size_t take = std::min(body.size(), limit - ids.size());
    ids.insert(ids.end(), body.begin(), body.begin() + static_cast<std::ptrdiff_t>(take));
  }
  ids.resize(limit);
  return ids;
}

}  // namespace estream::profiler
