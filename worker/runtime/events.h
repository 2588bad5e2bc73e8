#pragma once

// What the worker tells its agent (Note [Worker protocol] in common/launch/worker_protocol.cc):
// a "ready" event after the rendezvous and resume, one "step" per step, and a last event
// saying how the worker ended.

#include <cstdint>
#include <string>

#include "varuna/v1/worker.pb.h"

namespace varuna {

// Reports `event` to the agent (AppendWorkerEvent, common/launch/worker_channel.h), logging a
// failure: the report is best effort, training goes on without it.
void ReportToAgent(v1::WorkerEvent event);

v1::WorkerEvent ErrorEvent(std::string message);

// How the worker ended after saving `step` (0: nothing saved): stopped on request, or rescued
// after an abort (with the newest committed step and the next step it wrote pending layers for:
// Note [Rolled rescue] in common/checkpoint/checkpoint_store.cc).
v1::WorkerEvent SavedEvent(bool rescued, int64_t step, int64_t committed = 0, int64_t pending = 0);

// Seconds since the epoch, the events' clock.
double UnixNow();

}  // namespace varuna
