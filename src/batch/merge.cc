#include "batch/merge.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/file_signals.h"
#include "base/output_path.h"
#include "batch/shard.h"

namespace estream::batch {
namespace {

using nlohmann::json;

// Where one result line is.
struct Loc {
  uint32_t file = 0;
  uint32_t length = 0;  // bytes, without the newline
  uint64_t offset = 0;
  int64_t line = 0;  // 1-based, for messages
};

struct Entry {
  Loc first;
  int32_t count = 0;     // lines with this key across the outputs
  bool expected = false; // an input line has this key (with --input)
  bool error = false;    // the first line is an error result
};

// "id \"q7\"" / "line 12" for a key.
std::string Describe(const std::string& key) {
  if (key.rfind("line:", 0) == 0) return "input line " + key.substr(5);
  return "id " + key;
}

// A list of problems of one kind: "3 ids ... : a, b, c" with at most `max` named.
struct Problems {
  explicit Problems(std::string w) : what(std::move(w)) {}
  std::string what;  // "input lines have no result in the shard outputs"
  std::vector<std::string> items;
  int64_t total = 0;
  void Add(size_t max, const std::string& item) {
    if (items.size() < max) items.push_back(item);
    ++total;
  }
  std::string Text() const {
    std::string s = std::to_string(total) + " " + what + ": ";
    for (size_t i = 0; i < items.size(); ++i) s += (i ? ", " : "") + items[i];
    if (total > static_cast<int64_t>(items.size()))
      s += " and " + std::to_string(total - static_cast<int64_t>(items.size())) + " more";
    return s;
  }
};

std::string Where(const std::vector<std::string>& files, const Loc& loc) {
  return files[loc.file] + ":" + std::to_string(loc.line);
}

bool SameFile(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  if (stat(a.c_str(), &sa) != 0 || stat(b.c_str(), &sb) != 0) return a == b;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

Status WriteAll(int fd, const std::string& path, const char* data, size_t n) {
  size_t off = 0;
  while (off < n) {
    const ssize_t w = write(fd, data + off, n - off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return Status::IOError(path + ": write failed: " + std::strerror(errno));
    off += static_cast<size_t>(w);
  }
  return Status::Ok();
}

}  // namespace

Result<MergeStats> MergeShardOutputs(const MergeOptions& o) {
  const std::vector<std::string>& files = o.shard_outputs;
  if (files.empty()) return Status::InvalidArgument("merge: give at least one shard output to merge");
  if (o.output.empty()) return Status::InvalidArgument("merge: give the merged file with -o/--output");
  if (files.size() > UINT32_MAX) return Status::InvalidArgument("merge: too many files");
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string& f = files[i];
    for (size_t k = 0; k < i; ++k)
      if (SameFile(files[k], f)) return Status::InvalidArgument("merge: " + f + " is given twice");
    if (SameFile(f, o.output))
      return Status::InvalidArgument("merge: the output " + o.output + " is also a shard output (" + f +
                                     "); write the merged file elsewhere");
    if (!o.input.empty() && SameFile(f, o.input))
      return Status::InvalidArgument("merge: " + f + " is given both as the input and as a shard output");
  }

  // 1. Index every result line of every output.
  std::unordered_map<std::string, Entry> index;
  std::vector<std::string> file_order;  // keys in file order (without --input)
  Problems bad{"lines of the shard outputs are not result lines (rerun their shards: a shard resumes and "
               "completes its file)"};
  Problems dup{"keys appear more than once in the shard outputs (a file given twice, or outputs of "
               "different shardings mixed)"};
  MergeStats stats;
  stats.lines_per_file.assign(files.size(), 0);
  for (uint32_t f = 0; f < files.size(); ++f) {
    std::ifstream in(files[f], std::ios::binary);
    if (!in) return Status::IOError("merge: " + files[f] + ": cannot open: " + std::strerror(errno));
    std::string text;
    uint64_t offset = 0;
    for (int64_t line = 1; std::getline(in, text); ++line) {
      const uint64_t at = offset;
      offset += text.size() + 1;
      const bool torn = in.eof();  // no newline at the end: a shard stopped mid-write
      if (!text.empty() && text.back() == '\r') text.pop_back();
      if (IsBlankLine(text)) continue;
      const Loc loc{f, static_cast<uint32_t>(text.size()), at, line};
      if (torn) {
        bad.Add(o.max_listed, Where(files, loc) + " (torn last line)");
        continue;
      }
      if (text.size() > UINT32_MAX) {
        bad.Add(o.max_listed, Where(files, loc) + " (longer than 4 GiB)");
        continue;
      }
      const json j = json::parse(text, nullptr, false);
      Result<std::string> key = j.is_discarded() ? Result<std::string>(Status::InvalidArgument("not JSON"))
                                                 : ResultKey(j);
      if (!key.ok()) {
        bad.Add(o.max_listed, Where(files, loc) + " (" + key.status().message() + ")");
        continue;
      }
      Entry& e = index[*key];
      if (++e.count == 1) {
        e.first = loc;
        e.error = j.contains("error");
        ++stats.lines_per_file[f];
        if (o.input.empty()) file_order.push_back(*key);
      } else {
        dup.Add(o.max_listed, Describe(*key) + " (" + Where(files, e.first) + " and " + Where(files, loc) + ")");
      }
    }
    if (in.bad()) return Status::IOError("merge: " + files[f] + ": read failed");
  }

  // 2. With the input: every line's key exactly once, no other key.
  std::vector<std::string> order;
  Problems missing{"input lines have no result in the shard outputs (a shard not run or not finished: "
                   "run it again with the same --shard and --output)"};
  Problems extra{"results are not of a line of " + o.input + " (outputs of another input?)"};
  if (!o.input.empty()) {
    std::ifstream in(o.input, std::ios::binary);
    if (!in) return Status::IOError("merge: " + o.input + ": cannot open: " + std::strerror(errno));
    LineKeys keys;
    std::string text;
    for (int64_t line = 1; std::getline(in, text); ++line) {
      if (IsBlankLine(text)) continue;
      const json j = json::parse(text, nullptr, false);
      bool duplicate = false;
      std::string key = keys.Add(j.is_discarded() ? json(nullptr) : IdOfLine(j), line, &duplicate);
      auto it = index.find(key);
      if (it == index.end()) {
        missing.Add(o.max_listed, Describe(key));
      } else {
        it->second.expected = true;
      }
      order.push_back(std::move(key));
    }
    if (in.bad()) return Status::IOError("merge: " + o.input + ": read failed");
    for (const auto& [key, e] : index)
      if (!e.expected) extra.Add(o.max_listed, Describe(key) + " (" + Where(files, e.first) + ")");
  } else {
    order = std::move(file_order);
  }

  std::string problems;
  for (const Problems* p : {&missing, &dup, &extra, &bad})
    if (p->total > 0) problems += (problems.empty() ? "" : "; ") + p->Text();
  if (!problems.empty()) return Status::InvalidArgument("merge refused, nothing written: " + problems);

  // 3. Write OUT.tmp in order, fsync, rename.
  std::vector<int> fds(files.size(), -1);
  struct Closer {
    std::vector<int>* fds;
    int out = -1;
    ~Closer() {
      for (int fd : *fds)
        if (fd >= 0) close(fd);
      if (out >= 0) close(out);
    }
  } closer{&fds};
  for (size_t f = 0; f < files.size(); ++f) {
    fds[f] = open(files[f].c_str(), O_RDONLY | O_CLOEXEC);
    if (fds[f] < 0) return Status::IOError("merge: " + files[f] + ": cannot open: " + std::strerror(errno));
  }
  // The merged file replaces OUT by a rename: OUT must be a regular file or a link to one
  // (base/output_path.h), or a device such as /dev/null would become a regular file.
  Result<std::string> target = ResolveOutputPath(o.output, "the merged output");
  if (!target.ok()) return Status(target.status().code(), "merge: " + target.status().message());
  const std::string tmp = *target + ".tmp";
  closer.out = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (closer.out < 0) return Status::IOError("merge: " + tmp + ": cannot create: " + std::strerror(errno));
  const int temp_slot = RegisterTempFile(tmp);  // removed if the process is killed
  std::string buf;
  auto fail = [&](Status s) {
    unlink(tmp.c_str());
    UnregisterTempFile(temp_slot);
    return s;
  };
  for (const std::string& key : order) {
    const Entry& e = index.at(key);
    const Loc& l = e.first;
    const size_t start = buf.size();
    buf.resize(start + l.length);
    size_t got = 0;
    while (got < l.length) {
      const ssize_t r = pread(fds[l.file], buf.data() + start + got, l.length - got, static_cast<off_t>(l.offset + got));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0)
        return fail(Status::IOError("merge: " + files[l.file] + ": read failed at byte " +
                                    std::to_string(l.offset + got) + " (changed while merging?)"));
      got += static_cast<size_t>(r);
    }
    if (buf.size() > start && buf.back() == '\r') buf.pop_back();
    buf += '\n';
    ++stats.lines;
    stats.error_lines += e.error;
    if (buf.size() >= (size_t{1} << 22)) {
      Status s = WriteAll(closer.out, tmp, buf.data(), buf.size());
      if (!s.ok()) return fail(s);
      buf.clear();
    }
  }
  Status s = WriteAll(closer.out, tmp, buf.data(), buf.size());
  if (!s.ok()) return fail(s);
  if (fsync(closer.out) != 0) return fail(Status::IOError("merge: " + tmp + ": fsync failed: " + std::strerror(errno)));
  close(closer.out);
  closer.out = -1;
  if (rename(tmp.c_str(), target->c_str()) != 0)
    return fail(Status::IOError("merge: cannot rename " + tmp + " to " + *target + ": " + std::strerror(errno)));
  UnregisterTempFile(temp_slot);
  return stats;
}

}  // namespace estream::batch
