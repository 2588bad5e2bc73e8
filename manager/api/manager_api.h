#pragma once

// The services' facade: the job and node queries and requests that the JobApi gRPC service
// and the HTTP API make of the manager, answered from the Manager's components
// (Manager::parts()). It owns nothing: a handle that any number of callers may hold over one
// Manager, which outlives them. The manager's loop thread only (the services post to it).

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/job_spec.h"
#include "manager/jobs/planning.h"
#include "manager/manager.h"
#include "manager/nodes/agent_client.h"
#include "manager/nodes/node_table.h"
#include "varuna/v1/control.pb.h"

namespace varuna {

class ManagerApi {
 public:
  // `agents` reaches the nodes' agents for the log proxy.
  ManagerApi(Manager* manager, AgentClientPool* agents);

  // `spec` from JobAdmission::Admit(req), which the server runs off the loop.
  absl::StatusOr<v1::JobInfo> Submit(const v1::SubmitRequest& req, JobSpec spec,
                                     const std::string& user = "", const std::string& run_as = "",
                                     uint32_t run_as_uid = 0, bool admin = true);
  std::vector<v1::JobInfo> ListJobs() const;
  // One page (Note [Pages] in manager_api.cc); InvalidArgument for a token that is no job's seq.
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& req) const;
  absl::StatusOr<v1::JobInfo> GetJob(const std::string& id) const;
  absl::StatusOr<v1::JobInfo> Cancel(const std::string& id, const std::string& user = "");
  // The log proxy: fetches a rank's log from its node's agent.
  void GetLogs(const v1::GetLogsRequest& req,
               std::function<void(absl::StatusOr<v1::GetLogsResponse>)> done);
  std::vector<v1::NodeInfo> ListNodes() const;
  // The machine sources' state (Slurm's counts and last error), for varunactl nodes.
  std::vector<v1::MachineSource> ListSources() const;
  absl::StatusOr<v1::NodeInfo> Drain(const std::string& node, bool undo);
  // A preemption notice for `node` (varunactl preempt, or the node's own agent).
  absl::StatusOr<v1::NodeInfo> Preempt(const std::string& node, const v1::PreemptionNotice& n);
  v1::ListEventsResponse ListEvents(const v1::ListEventsRequest& req) const;
  absl::StatusOr<v1::GetMetricsResponse> GetMetrics(const v1::GetMetricsRequest& req) const;
  // What varunactl plan needs (slots, stored profile); the planning runs off the loop
  // (PlanOnCluster in planning.h).
  PlanInputs PlanInputsFor(const JobSpec& spec) const;
  v1::GetProfileResponse GetProfile(const v1::GetProfileRequest& req) const;
  // The stage map of a job's current generation (varunactl stages).
  absl::StatusOr<v1::GetStagesResponse> GetStages(const std::string& id) const;

 private:
  v1::NodeInfo Describe(const NodeTable::Node& n) const;

  Manager* const manager_;
  AgentClientPool* const agents_;
};

}  // namespace varuna
