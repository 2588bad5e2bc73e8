#include "common/launch/worker_protocol.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/pipeline/topology.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace varuna {

// Note [Worker protocol]: the worker and the agent speak typed messages
// (proto/varuna/v1/worker.proto), one line of protobuf JSON each, in both directions:
//
// - Worker -> agent: WorkerEvent lines appended to a file the agent names in
//   VARUNA_PROGRESS_FILE (gen<g>/progress.rank<r>): "ready" after the rendezvous and resume,
//   one "step" per optimizer step, and a last line saying how the worker ended ("stopped" or
//   "rescued" with the step saved, or "error"). Each line is one write(2) on an O_APPEND file,
//   so a reader never sees half of a finished write. The agent reads new complete lines on
//   every heartbeat, from an offset it keeps (Note [Progress file] in agent.cc). A file, not a
//   socket: nothing is lost while the agent is busy or restarting, and a worker that writes
//   nothing (a user program) still runs.
// - Agent -> worker: AgentCommand lines written to a pipe the agent makes for each process it
//   starts; the worker inherits the read end as file descriptor 3 (VARUNA_CONTROL_FD=3) and a
//   thread reads it (AgentCommandListener, worker_channel.h). A pipe, not a path: no other
//   process can open it (a FIFO in the job's directory could be written by any process of the
//   job's uid, and a forged reconfigure sends a worker to another host), and commands sent
//   while a worker still loads wait in the pipe. The agent writes an empty line first and
//   sends commands only once the pipe has been drained: until then (a program that ignores
//   the channel, a worker still loading) SendCommand fails at once and the agent sends the
//   signal that has always meant the same (stop: SIGUSR1, checkpoint_now: SIGUSR2). A
//   command line is at most PIPE_BUF bytes with its newline, so it arrives whole. A worker
//   started by hand may name a FIFO in VARUNA_CONTROL_FIFO instead, which it holds open
//   read-write (so it never sees end-of-file).
//
// Every line is bounded (kMaxEventLineBytes, kMaxCommandLineBytes) and parsed only here.
// Event lines in the flat form user programs have always written ({"step": 7, "loss": 2.5},
// {"ready": true}, {"error": "..."}) parse into the same WorkerEvent; the form is told by
// the value of the kind's key: an object in the typed form, a scalar in the flat one.

namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

// Returns the length of the valid UTF-8 sequence at the start of `s` (1..4), or 0.
size_t Utf8Length(absl::string_view s) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const auto cont = [&](size_t i) { return i < s.size() && (b(i) & 0xC0) == 0x80; };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    if (c == 0xE0 && b(1) < 0xA0) return 0;   // overlong
    if (c == 0xED && b(1) >= 0xA0) return 0;  // surrogate
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    if (c == 0xF0 && b(1) < 0x90) return 0;   // overlong
    if (c == 0xF4 && b(1) >= 0x90) return 0;  // past U+10FFFF
    return 4;
  }
  return 0;
}

// `s` with every byte that is not part of valid UTF-8 replaced by '?' (protobuf refuses
// such strings, and a worker's error message may quote anything).
std::string SanitizeUtf8(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  while (!s.empty()) {
    const size_t n = Utf8Length(s);
    if (n == 0) {
      out += '?';
      s.remove_prefix(1);
    } else {
      out.append(s.data(), n);
      s.remove_prefix(n);
    }
  }
  return out;
}

// Cuts valid UTF-8 `s` to at most `max` bytes, at a character boundary.
void CutUtf8(std::string* s, size_t max) {
  if (s->size() <= max) return;
  size_t n = max;
  while (n > 0 && (static_cast<unsigned char>((*s)[n]) & 0xC0) == 0x80) --n;
  s->resize(n);
}

// printf's spellings of the non-finite values (nan, -nan, inf, -inf, any case) outside JSON
// strings become protobuf JSON's ("NaN", "Infinity", "-Infinity"); other bare words stay.
std::string QuoteBareNonFinite(absl::string_view in) {
  std::string out;
  out.reserve(in.size());
  bool in_string = false;
  for (size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < in.size()) {
        out += in[++i];
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
      out += c;
      continue;
    }
    const bool minus = c == '-' && i + 1 < in.size() && absl::ascii_isalpha(in[i + 1]);
    if (!minus && !absl::ascii_isalpha(c)) {
      out += c;
      continue;
    }
    size_t j = i + (minus ? 1 : 0);
    while (j < in.size() && absl::ascii_isalpha(in[j])) ++j;
    const std::string word = absl::AsciiStrToLower(in.substr(i, j - i));
    if (word == "nan" || word == "-nan") {
      out += "\"NaN\"";
    } else if (word == "inf" || word == "infinity") {
      out += "\"Infinity\"";
    } else if (word == "-inf" || word == "-infinity") {
      out += "\"-Infinity\"";
    } else {
      out.append(in.data() + i, j - i);
    }
    i = j - 1;
  }
  return out;
}

// The line without surrounding whitespace, or an error if it is empty or too long.
absl::StatusOr<std::string> PrepareLine(absl::string_view line, size_t max, const char* what) {
  line = absl::StripAsciiWhitespace(line);
  if (line.empty()) return absl::InvalidArgumentError(absl::StrCat("empty ", what, " line"));
  if (line.size() > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " line of ", line.size(), " bytes is over the limit of ", max));
  }
  return QuoteBareNonFinite(SanitizeUtf8(line));
}

// A status's message, first line only and bounded: protobuf's may quote the input. Takes
// absl's and protobuf's own Status alike.
template <typename S>
std::string Brief(const S& s) {
  std::string m(s.message().data(), s.message().size());
  m = m.substr(0, m.find('\n'));
  CutUtf8(&m, 200);
  return m;
}

std::optional<double> NumberOf(const Value* v) {
  if (v == nullptr) return std::nullopt;
  if (v->kind_case() == Value::kNumberValue) return v->number_value();
  if (v->kind_case() != Value::kStringValue) return std::nullopt;
  const std::string s = absl::AsciiStrToLower(v->string_value());
  if (s == "nan" || s == "-nan") return std::numeric_limits<double>::quiet_NaN();
  if (s == "inf" || s == "infinity") return std::numeric_limits<double>::infinity();
  if (s == "-inf" || s == "-infinity") return -std::numeric_limits<double>::infinity();
  return std::nullopt;
}

// An integer field of a flat line in [lo, INT32_MAX]; absent = 0.
absl::StatusOr<int32_t> FlatInt(const Struct& s, const char* key, int32_t lo) {
  auto it = s.fields().find(key);
  if (it == s.fields().end()) return 0;
  const Value& v = it->second;
  const double d = v.kind_case() == Value::kNumberValue ? v.number_value()
                                                        : -std::numeric_limits<double>::infinity();
  if (!(d >= lo && d <= std::numeric_limits<int32_t>::max()) || d != std::floor(d)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", key, "' must be an integer in [", lo, ", 2147483647]"));
  }
  return static_cast<int32_t>(d);
}

bool FlatFlag(const Struct& s, const char* key) {
  auto it = s.fields().find(key);
  return it != s.fields().end() && it->second.kind_case() == Value::kBoolValue &&
         it->second.bool_value();
}

const std::string* FlatString(const Struct& s, const char* key) {
  auto it = s.fields().find(key);
  if (it == s.fields().end() || it->second.kind_case() != Value::kStringValue) return nullptr;
  return &it->second.string_value();
}

// A flat step line's StepMetrics fields, by name; a field of a wrong type is left unset.
void FlatStepFields(const Struct& s, v1::StepMetrics* m) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = m->GetReflection();
  const google::protobuf::Descriptor* d = m->GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    auto it = s.fields().find(f->name());
    if (it == s.fields().end() || f->name() == "step") continue;
    const Value& v = it->second;
    if (f->is_repeated()) {
      if (f->cpp_type() != FieldDescriptor::CPPTYPE_DOUBLE || !v.has_list_value()) continue;
      const auto& list = v.list_value().values();
      if (list.size() > kMaxStageValues) continue;
      for (const Value& x : list) {
        if (auto n = NumberOf(&x)) r->AddDouble(m, f, *n);
      }
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE) {
      if (auto n = NumberOf(&v)) r->SetDouble(m, f, *n);
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_BOOL) {
      if (v.kind_case() == Value::kBoolValue) r->SetBool(m, f, v.bool_value());
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_INT32) {
      const double n = NumberOf(&v).value_or(0.5);
      if (n == std::floor(n) && std::abs(n) <= std::numeric_limits<int32_t>::max()) {
        r->SetInt32(m, f, static_cast<int32_t>(n));
      }
    }
  }
}

// The flat form: the kind is a key with a scalar value (Note [Worker protocol]).
absl::StatusOr<v1::WorkerEvent> FromFlat(const Struct& s) {
  v1::WorkerEvent e;
  e.set_t(NumberOf(s.fields().count("t") ? &s.fields().at("t") : nullptr).value_or(0));
  if (FlatFlag(s, "ready")) {
    ASSIGN_OR_RETURN(int32_t from, FlatInt(s, "resumed_from", 0));
    e.mutable_ready()->set_resumed_from(from);
    return e;
  }
  if (const std::string* path = FlatString(s, "profile")) {
    e.mutable_profile()->set_path(*path);
    return e;
  }
  if (const std::string* message = FlatString(s, "error")) {
    e.mutable_error()->set_message(*message);
    e.mutable_error()->set_bad_input(FlatFlag(s, "bad_input"));
    return e;
  }
  const bool stopped = FlatFlag(s, "stopped");
  const bool rescued = FlatFlag(s, "rescued");
  if (rescued || (stopped && !s.fields().count("step"))) {
    ASSIGN_OR_RETURN(int32_t saved, FlatInt(s, "saved_step", 0));
    if (rescued) {
      e.mutable_rescued()->set_saved_step(saved);
    } else {
      e.mutable_stopped()->set_saved_step(saved);
    }
    return e;
  }
  if (!s.fields().count("step")) {
    return absl::InvalidArgumentError(
        "no event in the line: expected one of ready, step, stopped, rescued, profile, error");
  }
  ASSIGN_OR_RETURN(int32_t step, FlatInt(s, "step", 1));
  v1::StepMetrics* m = e.mutable_step();
  FlatStepFields(s, m);
  m->set_step(step);
  m->set_stopped(stopped);
  return e;
}

// True when some kind's key holds an object: the typed form.
bool IsTypedForm(const Struct& s) {
  const google::protobuf::OneofDescriptor* kind =
      v1::WorkerEvent::descriptor()->FindOneofByName("kind");
  for (int i = 0; i < kind->field_count(); ++i) {
    auto it = s.fields().find(kind->field(i)->name());
    if (it != s.fields().end() && it->second.has_struct_value()) return true;
  }
  return false;
}

// The bounds that are cuts rather than errors (ParseWorkerEvent and SerializeWorkerEvent
// both apply them, so that a serialized event parses back to itself).
void Normalize(v1::WorkerEvent* e) {
  if (!std::isfinite(e->t())) e->set_t(0);
  switch (e->kind_case()) {
    case v1::WorkerEvent::kStep: {
      v1::StepMetrics* m = e->mutable_step();
      if (m->stage_busy_s_size() > kMaxStageValues) m->clear_stage_busy_s();
      if (m->stage_wait_s_size() > kMaxStageValues) m->clear_stage_wait_s();
      if (m->rank_busy_s_size() > kMaxRankValues) m->clear_rank_busy_s();
      if (m->rank_wait_s_size() > kMaxRankValues) m->clear_rank_wait_s();
      if (m->at() == 0) m->set_at(e->t());
      break;
    }
    case v1::WorkerEvent::kError: {
      v1::WorkerError* err = e->mutable_error();
      *err->mutable_message() = SanitizeUtf8(err->message());
      CutUtf8(err->mutable_message(), kMaxErrorBytes);
      *err->mutable_command() = SanitizeUtf8(err->command());
      CutUtf8(err->mutable_command(), 64);
      break;
    }
    case v1::WorkerEvent::kProfile:
      *e->mutable_profile()->mutable_path() = SanitizeUtf8(e->profile().path());
      break;
    case v1::WorkerEvent::kParked:
      *e->mutable_parked()->mutable_reason() = SanitizeUtf8(e->parked().reason());
      CutUtf8(e->mutable_parked()->mutable_reason(), kMaxErrorBytes);
      break;
    default:
      break;
  }
}

absl::Status Validate(const v1::WorkerEvent& e) {
  switch (e.kind_case()) {
    case v1::WorkerEvent::KIND_NOT_SET:
      return absl::InvalidArgumentError(
          "no event in the line: expected one of ready, step, stopped, rescued, profile, error, "
          "parked");
    case v1::WorkerEvent::kStep:
      if (e.step().step() < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("step ", e.step().step(), " is not a step number (>= 1)"));
      }
      break;
    case v1::WorkerEvent::kReady:
      if (e.ready().resumed_from() < 0) {
        return absl::InvalidArgumentError("ready: resumed_from must be >= 0");
      }
      break;
    case v1::WorkerEvent::kStopped:
      if (e.stopped().saved_step() < 0) {
        return absl::InvalidArgumentError("stopped: saved_step must be >= 0");
      }
      break;
    case v1::WorkerEvent::kRescued:
      if (e.rescued().saved_step() < 0) {
        return absl::InvalidArgumentError("rescued: saved_step must be >= 0");
      }
      break;
    case v1::WorkerEvent::kProfile:
      if (e.profile().path().empty() || e.profile().path().size() > kMaxPathBytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("profile: the path must have 1 to ", kMaxPathBytes, " bytes"));
      }
      break;
    case v1::WorkerEvent::kError:
      break;
    case v1::WorkerEvent::kParked:
      if (e.parked().step() < 0) return absl::InvalidArgumentError("parked: step must be >= 0");
      break;
  }
  return absl::OkStatus();
}

absl::Status ValidateCommand(const v1::AgentCommand& c) {
  if (c.kind_case() == v1::AgentCommand::KIND_NOT_SET) {
    return absl::InvalidArgumentError(
        "no command in the line: expected one of stop, checkpoint_now, reconfigure, start");
  }
  if (c.generation() < 0) return absl::InvalidArgumentError("generation must be >= 0");
  if (c.kind_case() == v1::AgentCommand::kStart &&
      (c.start().spec_path().empty() || c.start().spec_path().size() > kMaxReconfigureText)) {
    return absl::InvalidArgumentError(
        absl::StrCat("start: spec_path must have 1 to ", kMaxReconfigureText, " bytes"));
  }
  if (c.kind_case() != v1::AgentCommand::kReconfigure) return absl::OkStatus();
  const v1::ReconfigureCommand& r = c.reconfigure();
  if (r.generation() < 1) {
    return absl::InvalidArgumentError("reconfigure: generation must be >= 1");
  }
  if (r.pipelines().size() > kMaxReconfigureText || r.master_addr().size() > kMaxReconfigureText) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reconfigure: pipelines and master_addr have at most ", kMaxReconfigureText, " bytes"));
  }
  if (r.stage_to_rank_map().size() > kMaxReconfigureText) {
    return absl::InvalidArgumentError(
        absl::StrCat("reconfigure: stage_to_rank_map has at most ", kMaxReconfigureText, " bytes"));
  }
  // Heterogeneous pipelines, or the uniform stage map with each pipeline's batch.
  int world = 0;
  if (!r.pipelines().empty()) {
    absl::StatusOr<Topology> topology = Topology::Parse(r.pipelines());
    if (!topology.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("reconfigure: ", topology.status().message()));
    }
    world = topology->world_size();
  } else {
    absl::StatusOr<StageMap> map = StageMap::Parse(r.stage_to_rank_map());
    if (!map.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "reconfigure: needs pipelines or a stage_to_rank_map: ", map.status().message()));
    }
    if (r.per_replica_batch() < 1) {
      return absl::InvalidArgumentError("reconfigure: a stage_to_rank_map needs per_replica_batch");
    }
    world = map->world_size();
  }
  if (r.rank() < 0 || r.rank() >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("reconfigure: rank ", r.rank(), " is outside the world of ", world));
  }
  if (r.micro_batch() < 0 || r.master_port() < 0 || r.master_port() > 65535) {
    return absl::InvalidArgumentError(
        "reconfigure: micro_batch must be >= 0 and master_port in [0, 65535]");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> PrintLine(const google::protobuf::Message& m, size_t max,
                                      const char* what) {
  google::protobuf::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  opts.always_print_primitive_fields = true;
  std::string out;
  auto st = google::protobuf::util::MessageToJsonString(m, &out, opts);
  if (!st.ok()) return absl::InternalError(absl::StrCat(what, ": ", Brief(st)));
  if (out.size() > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " line of ", out.size(), " bytes is over the limit of ", max));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> SerializeWorkerEvent(const v1::WorkerEvent& event) {
  v1::WorkerEvent e = event;
  Normalize(&e);
  RETURN_IF_ERROR(Validate(e));
  return PrintLine(e, kMaxEventLineBytes, "event");
}

absl::StatusOr<v1::WorkerEvent> ParseWorkerEvent(absl::string_view line) {
  ASSIGN_OR_RETURN(std::string text, PrepareLine(line, kMaxEventLineBytes, "event"));
  Struct s;
  if (auto st = google::protobuf::util::JsonStringToMessage(text, &s); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("not a JSON object on one line: ", Brief(st)));
  }
  v1::WorkerEvent e;
  if (IsTypedForm(s)) {
    google::protobuf::util::JsonParseOptions opts;
    opts.ignore_unknown_fields = true;  // a newer worker's fields
    if (auto st = google::protobuf::util::JsonStringToMessage(text, &e, opts); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("bad event: ", Brief(st)));
    }
  } else {
    ASSIGN_OR_RETURN(e, FromFlat(s));
  }
  Normalize(&e);
  RETURN_IF_ERROR(Validate(e));
  return e;
}

absl::StatusOr<std::string> SerializeAgentCommand(const v1::AgentCommand& command) {
  RETURN_IF_ERROR(ValidateCommand(command));
  return PrintLine(command, kMaxCommandLineBytes, "command");
}

absl::StatusOr<v1::AgentCommand> ParseAgentCommand(absl::string_view line) {
  ASSIGN_OR_RETURN(std::string text, PrepareLine(line, kMaxCommandLineBytes, "command"));
  v1::AgentCommand c;
  google::protobuf::util::JsonParseOptions opts;
  opts.ignore_unknown_fields = true;  // a newer agent's fields
  if (auto st = google::protobuf::util::JsonStringToMessage(text, &c, opts); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("bad command: ", Brief(st)));
  }
  RETURN_IF_ERROR(ValidateCommand(c));
  return c;
}

const char* CommandKindName(const v1::AgentCommand& command) {
  switch (command.kind_case()) {
    case v1::AgentCommand::kStop:
      return "stop";
    case v1::AgentCommand::kCheckpointNow:
      return "checkpoint_now";
    case v1::AgentCommand::kReconfigure:
      return "reconfigure";
    case v1::AgentCommand::kStart:
      return "start";
    case v1::AgentCommand::KIND_NOT_SET:
      break;
  }
  return "none";
}

std::string StandbyStartPath(const std::string& dir, int pid) {
  return absl::StrCat(dir.empty() ? "." : dir, "/start/", pid, ".json");
}

}  // namespace varuna
