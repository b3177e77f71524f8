// The estream CLI is a thin front end: one file per subcommand (cmd_*.cc), each registering a
// Command with its name and help (ESTREAM_REGISTER_COMMAND). main.cc builds the CLI11 app from
// the registry, parses, and runs the chosen command; an error it returns becomes one line on
// stderr ("estream <cmd>: error: ...") and exit code 1. The library never exits.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/size.h"
#include "base/stats.h"  // FormatBytes, Median
#include "base/status.h"

namespace estream::cli {

class Command;

// A registered command: its name and one-line help (the CLI11 subcommand's) and its factory.
struct CommandEntry {
  const char* name;
  const char* help;
  std::unique_ptr<Command> (*make)();
};
std::vector<CommandEntry>& CommandRegistry();

class Command {
 public:
  virtual ~Command() = default;
  // The registered name ("prefill") and help line.
  const char* name() const { return name_; }
  const char* help() const { return help_; }
  // Adds options and flags to `sub` (bound to members of the command).
  virtual void Setup(CLI::App* sub) = 0;
  // Runs after a successful parse: the process exit code (0, or a command's own code such as 1
  // for "some lines failed"), or an error, which main prints as "estream <command>: error: ..."
  // (ReportError) and exits with 1.
  virtual Result<int> Run() = 0;

  // A new command of `entry`, named.
  static std::unique_ptr<Command> Create(const CommandEntry& entry);

 private:
  const char* name_ = "";
  const char* help_ = "";
};

struct CommandRegistrar {
  CommandRegistrar(const char* name, const char* help, std::unique_ptr<Command> (*make)()) {
    CommandRegistry().push_back({name, help, make});
  }
};

// Registers the command class Type (default-constructible) as `estream NAME`, with the one-line
// HELP of `estream --help`.
#define ESTREAM_REGISTER_COMMAND(Type, name, help)                                              \
  static ::estream::cli::CommandRegistrar estream_registrar_##Type(                            \
      name, help, []() -> std::unique_ptr<::estream::cli::Command> { return std::make_unique<Type>(); })

// Prints "estream <command>: error: <status message>" to stderr; returns 1.
int ReportError(const char* command, const Status& status);

// A progress callback that prints "estream <command>: <line>" to stderr (flushed).
std::function<void(const std::string&)> ProgressPrinter(const char* command);

// Sizes: estream::ParseSize (base/size.h).
using estream::ParseSize;
// The value of --budget: a size (ParseSize) that must be positive.
Result<uint64_t> ParseBudget(const std::string& text);

// Whether an output file named by `flag` (e.g. "--json") can be written, checked before a command
// does its work (bench ran every benchmark, then failed to write): an existing file must be
// writable and not a directory, a new one needs a writable directory. Ok for an empty path.
Status CheckWritableOutput(const std::string& path, const std::string& flag);

// The most bytes ReadFileText reads: 1 GiB, a hundred times the largest of llama-perplexity's
// task files (HellaSwag's 10042 tasks are 10 MB) and twice wikitext-103's training text.
constexpr uint64_t kMaxInputFileBytes = uint64_t{1} << 30;

// The whole of a file (eval's task file, perplexity's and tokenize's -f, prefill's -f and
// --tokens @FILE), as bytes. A regular file or a pipe; InvalidArgument naming the file for a
// directory, a device (/dev/zero) or a socket, and for more than kMaxInputFileBytes; IOError if
// it cannot be opened or read.
Result<std::string> ReadFileText(const std::string& path);

}  // namespace estream::cli
