#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>

#include "base/cpu.h"
#include "base/file_signals.h"
#include "tools/estream/command.h"

namespace estream::cli {

std::vector<CommandEntry>& CommandRegistry() {
  static std::vector<CommandEntry> registry;
  return registry;
}

std::unique_ptr<Command> Command::Create(const CommandEntry& entry) {
  std::unique_ptr<Command> c = entry.make();
  c->name_ = entry.name;
  c->help_ = entry.help;
  return c;
}

int ReportError(const char* command, const Status& status) {
  std::fprintf(stderr, "estream %s: error: %s\n", command, status.message().c_str());
  return 1;
}

Result<uint64_t> ParseBudget(const std::string& text) {
  ESTREAM_ASSIGN_OR_RETURN(uint64_t bytes, ParseSize(text));
  if (bytes == 0) return Status::InvalidArgument("a memory budget must be positive (leave --budget out for none)");
  return bytes;
}

Status CheckWritableOutput(const std::string& path, const std::string& flag) {
  if (path.empty()) return Status::Ok();
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return Status::InvalidArgument(flag + " " + path + " is a directory: give a file");
    if (::access(path.c_str(), W_OK) != 0)
      return Status::IOError(flag + " " + path + ": cannot write: " + std::strerror(errno));
    return Status::Ok();
  }
  if (errno != ENOENT) return Status::IOError(flag + " " + path + ": " + std::strerror(errno));
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    return Status::IOError(flag + " " + path + ": cannot create: " + dir + ": " + std::strerror(errno));
  return Status::Ok();
}

Result<std::string> ReadFileText(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return Status::IOError(path + ": cannot open: " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) return Status::InvalidArgument(path + " is a directory: give a file");
  // A device (/dev/zero, /dev/urandom, a terminal) never ends or is not a text: refused before
  // reading; a pipe (<(cmd), /dev/stdin from a pipe) is read up to the cap below.
  if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode))
    return Status::InvalidArgument(path + " is not a regular file or a pipe (a device or a socket): give a file");
  const std::string too_big = path + " is larger than " + FormatBytes(kMaxInputFileBytes) +
                              ", the most estream reads as a text or task file; split it, or give a part of it";
  if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) > kMaxInputFileBytes)
    return Status::InvalidArgument(too_big);
  const std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) return Status::IOError(path + ": cannot open: " + std::strerror(errno));
  std::string text;
  if (S_ISREG(st.st_mode)) text.reserve(static_cast<size_t>(st.st_size));  // may throw bad_alloc: main says so
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f.get())) > 0) {
    if (text.size() + n > kMaxInputFileBytes) return Status::InvalidArgument(too_big);
    text.append(buf, n);
  }
  if (std::ferror(f.get())) return Status::IOError(path + ": read failed");
  return text;
}

std::function<void(const std::string&)> ProgressPrinter(const char* command) {
  return [command](const std::string& line) {
    std::fprintf(stderr, "estream %s: %s\n", command, line.c_str());
    std::fflush(stderr);
  };
}

// A command-line error as every other error: one line naming the command, exit code 1 (CLI11's
// own report is two lines and a code per kind of error).
int ReportParseError(int argc, char** argv, const std::vector<std::unique_ptr<Command>>& commands,
                     const std::vector<CLI::App*>& subs, const CLI::ParseError& e) {
  std::string message = e.what();
  std::replace(message.begin(), message.end(), '\n', ' ');
  while (!message.empty() && message.back() == ' ') message.pop_back();
  for (size_t i = 0; i < commands.size(); ++i) {
    if (!subs[i]->parsed()) continue;
    std::fprintf(stderr, "estream %s: error: %s (see 'estream %s --help')\n", commands[i]->name(), message.c_str(),
                 commands[i]->name());
    return 1;
  }
  std::string names;
  for (const auto& c : commands) names += std::string(names.empty() ? "" : ", ") + c->name();
  if (argc >= 2 && argv[1][0] != '-')
    std::fprintf(stderr, "estream: error: unknown command '%s'; the commands are %s (see 'estream --help')\n",
                 argv[1], names.c_str());
  else
    std::fprintf(stderr, "estream: error: %s; give a command: %s (see 'estream --help')\n", message.c_str(),
                 names.c_str());
  return 1;
}

}  // namespace estream::cli

int main(int argc, char** argv) {
  using namespace estream::cli;
  CLI::App app{"estream: fast, memory-bounded prefill for mixture-of-experts models (GGUF)\n"
               "Run 'estream <command> --help' for the options of a command."};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("estream 0.1.0 (kernels: ") +
                                        estream::IsaName(estream::ActiveIsa()) + ")");
  std::vector<std::unique_ptr<Command>> commands;
  std::vector<CLI::App*> subs;
  for (const CommandEntry& entry : CommandRegistry()) {
    commands.push_back(Command::Create(entry));
    CLI::App* sub = app.add_subcommand(commands.back()->name(), commands.back()->help());
    commands.back()->Setup(sub);
    subs.push_back(sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    return ReportParseError(argc, argv, commands, subs, e);
  }
  for (size_t i = 0; i < commands.size(); ++i) {
    if (!subs[i]->parsed()) continue;
    // A model file truncated or unreadable while mapped: one line and exit status 74, not a
    // bare "Bus error"; temporary outputs removed when the command is killed.
    estream::InstallFileSignalHandlers(std::string("estream ") + commands[i]->name() + ": error: ");
    // Errors are Status values; an exception reaching here (an allocation that failed: an input
    // or a pass too large for the memory left) still ends as one line and exit code 1, not abort.
    try {
      estream::Result<int> code = commands[i]->Run();
      return code.ok() ? *code : ReportError(commands[i]->name(), code.status());
    } catch (const std::bad_alloc&) {
      return ReportError(commands[i]->name(),
                         estream::Status::ResourceExhausted("out of memory: the input or the model does not fit "
                                                            "in the memory left; free memory or give a smaller input"));
    } catch (const std::exception& e) {
      return ReportError(commands[i]->name(), estream::Status::Internal(std::string("unexpected error: ") + e.what()));
    }
  }
  return 1;
}
