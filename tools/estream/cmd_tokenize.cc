// estream tokenize: text -> token ids with the model's own vocabulary (GGUF tokenizer.* keys).
//
//   estream tokenize -m model.gguf -p "Hello world"          one line per token: id and piece
//   estream tokenize -m model.gguf -f prompt.txt --ids       the ids only, space separated
//   estream tokenize -m model.gguf -p "Hi" --json            {"ids": [...], "pieces": [...], "bytes": [...]}
//
// BOS (and EOS) are added as the vocabulary's metadata says unless --no-bos. Control tokens
// such as <|im_start|> are matched in the text only with --parse-special. Text that is not valid
// UTF-8 is tokenized with U+FFFD in place of each bad sequence, with a warning on stderr.
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/json_text.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "tools/estream/command.h"

namespace estream::cli {
namespace {

// A piece as a quoted, printable string: control bytes and bytes of incomplete UTF-8 sequences
// appear as escapes (\n, \t, \xNN).
std::string Printable(const std::string& piece) {
  std::string out = "'";
  size_t i = 0;
  while (i < piece.size()) {
    const auto c = static_cast<unsigned char>(piece[i]);
    if (c >= 0x80) {
      const size_t n = tok::ValidSequenceLength(piece, i);
      if (n > 0) {
        out.append(piece, i, n);
        i += n;
      } else {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\x%02X", c);
        out += buf;
        ++i;
      }
      continue;
    }
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c == '\\') out += "\\\\";
    else if (c == '\'') out += "\\'";
    else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02X", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
    ++i;
  }
  return out + "'";
}

class TokenizeCommand : public Command {
 public:
  void Setup(CLI::App* sub) override {
    sub->add_option("-m,--model", model_, "GGUF file (a vocab-only GGUF works too)")->required();
    text_opt_ = sub->add_option("-p,--prompt", text_, "text to tokenize");
    file_opt_ = sub->add_option("-f,--file", file_, "file holding the text to tokenize");
    text_opt_->excludes(file_opt_);
    sub->add_flag("--ids", ids_only_, "print only the ids, space separated, on one line");
    sub->add_flag("--json", json_, "print {\"ids\": [...], \"pieces\": [...], \"bytes\": [...]}: bytes[i] is null, or "
                  "piece i's bytes as integers when it is not valid UTF-8 (a byte token: the piece shows U+FFFD)");
    sub->add_flag("--no-bos", no_bos_, "do not add the BOS/EOS tokens the vocabulary asks for");
    sub->add_flag("--parse-special", parse_special_,
                  "recognise control tokens such as <|im_start|> or <s> written in the text");
  }

  Result<int> Run() override {
    if (text_opt_->count() == 0 && file_opt_->count() == 0)
      return Status::InvalidArgument("give the text with -p TEXT or -f FILE");
    std::string text = text_;
    if (file_opt_->count() > 0) {
      ESTREAM_ASSIGN_OR_RETURN(text, ReadFileText(file_));
    }
    ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(model_));
    ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::FromGguf(*gguf));
    size_t bad = 0;
    if (!Tokenizer::IsValidUtf8(text, &bad))
      std::fprintf(stderr,
                   "estream tokenize: warning: %s is not valid UTF-8 (first bad byte at offset %zu); "
                   "each ill-formed sequence is tokenized as U+FFFD\n",
                   file_.empty() ? "the text" : file_.c_str(), bad);
    const std::vector<int32_t> ids = tok->Encode(text, !no_bos_, parse_special_);

    if (json_) {
      nlohmann::json j;
      j["ids"] = ids;
      // A piece that cuts a multi-byte character (a byte token) is not valid UTF-8: JSON has U+FFFD
      // for its bytes, so its raw bytes go beside it (bytes[i]: null for a valid piece), and the
      // pieces join back into the text.
      nlohmann::json pieces = nlohmann::json::array(), bytes = nlohmann::json::array();
      for (int32_t id : ids) {
        const std::string piece = tok->TokenPiece(id);
        pieces.push_back(piece);
        const std::vector<uint8_t> raw(piece.begin(), piece.end());
        bytes.push_back(Tokenizer::IsValidUtf8(piece) ? nlohmann::json() : nlohmann::json(raw));
      }
      j["pieces"] = std::move(pieces);
      j["bytes"] = std::move(bytes);
      std::printf("%s\n", DumpJson(j).c_str());
      return 0;
    }
    if (ids_only_) {
      std::string line;
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i) line.push_back(' ');
        line += std::to_string(ids[i]);
      }
      std::printf("%s\n", line.c_str());
      return 0;
    }
    for (int32_t id : ids) std::printf("%8d  %s\n", id, Printable(tok->TokenPiece(id)).c_str());
    std::fprintf(stderr, "%zu tokens (%s / %s, %d in vocabulary)\n", ids.size(), tok->model().c_str(),
                 tok->pre().empty() ? "spm" : tok->pre().c_str(), tok->n_vocab());
    return 0;
  }

 private:
  std::string model_, text_, file_;
  CLI::Option* text_opt_ = nullptr;
  CLI::Option* file_opt_ = nullptr;
  bool ids_only_ = false, json_ = false, no_bos_ = false, parse_special_ = false;
};

}  // namespace

ESTREAM_REGISTER_COMMAND(TokenizeCommand, "tokenize",
                         "Turn text into token ids with the model's vocabulary (GGUF tokenizer.* keys)");

}  // namespace estream::cli
