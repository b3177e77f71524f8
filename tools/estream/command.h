// The estream CLI is a thin front end: one file per subcommand (cmd_*.cc), each registering a
// Command with ESTREAM_REGISTER_COMMAND. main.cc builds the CLI11 app from the registry, parses,
// and runs the chosen command. Commands turn Status errors into a one-line message on stderr
// ("estream <cmd>: error: ...") and a non-zero exit code; the library never exits.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/stats.h"  // FormatBytes, Median
#include "base/status.h"

namespace estream::cli {

class Command {
 public:
  virtual ~Command() = default;
  virtual const char* name() const = 0;
  virtual const char* help() const = 0;
  // Adds options and flags to `sub` (bound to members of the command).
  virtual void Setup(CLI::App* sub) = 0;
  // Runs after a successful parse. Returns the process exit code.
  virtual int Run() = 0;
};

using CommandFactory = std::unique_ptr<Command> (*)();
std::vector<CommandFactory>& CommandRegistry();

struct CommandRegistrar {
  explicit CommandRegistrar(CommandFactory f) { CommandRegistry().push_back(f); }
};

#define ESTREAM_REGISTER_COMMAND(Type)                                                        \
  static ::estream::cli::CommandRegistrar estream_registrar_##Type(                          \
      []() -> std::unique_ptr<::estream::cli::Command> { return std::make_unique<Type>(); })

// Prints "estream <command>: error: <status message>" to stderr; returns 1.
int ReportError(const char* command, const Status& status);

// A progress callback that prints "estream <command>: <line>" to stderr (flushed).
std::function<void(const std::string&)> ProgressPrinter(const char* command);

// Parses a size with an optional K/M/G/T suffix (powers of 1024; "4G", "512M", "1000").
Result<uint64_t> ParseSize(const std::string& text);

}  // namespace estream::cli
