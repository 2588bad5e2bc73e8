#pragma once

// The log proxy (varunactl logs): a rank's log, fetched from the agent of the node it ran on.

#include <functional>

#include "absl/status/statusor.h"
#include "manager/jobs/job.h"
#include "manager/nodes/agent_client.h"
#include "manager/nodes/node_table.h"
#include "varuna/v1/control.pb.h"

namespace varuna {

// Calls `done` (on a gRPC thread, or at once for a request that names no reachable rank)
// with the bytes of rank req.rank()'s log from req.offset().
void ProxyLogs(const Job& job, const NodeTable& nodes, AgentClientPool* agents,
               const v1::GetLogsRequest& req,
               std::function<void(absl::StatusOr<v1::GetLogsResponse>)> done);

}  // namespace varuna
