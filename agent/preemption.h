#pragma once

// Cloud preemption notices (docs/morphing.md "Triggers"): the agent polls the metadata
// endpoint given as --preemption_notice_url and understands the three clouds' replies.
//
//   Azure Scheduled Events  GET .../metadata/scheduledevents?api-version=2020-07-01
//                           (header Metadata: true): {"Events": [{"EventType": "Preempt",
//                           "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT", ...}]}
//   GCE                     GET .../computeMetadata/v1/instance/preempted
//                           (header Metadata-Flavor: Google): TRUE or FALSE
//   AWS spot                GET .../latest/meta-data/spot/instance-action: 404 until the
//                           notice, then {"action": "terminate", "time": "2017-09-18T08:22:00Z"}

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "varuna/v1/control.pb.h"

namespace varuna {

// The notice in one reply (HTTP status and body), or nullopt if there is none. `vm_names`: the
// names this machine may have in Azure's Resources lists (an Azure event for another VM, or
// one already Completed or Canceled, is no notice: Note [Whose notice]). Never throws.
std::optional<v1::PreemptionNotice> ParsePreemptionReply(int http_status, const std::string& body,
                                                         const std::vector<std::string>& vm_names);

struct HttpReply {
  int status = 0;
  std::string body;
};
// A plain HTTP/1.0 GET of http://HOST[:PORT]/PATH with both clouds' metadata headers; at most
// 64 KiB of body; connecting, sending and the whole reply within `timeout`. If `cancel_fd`
// (>= 0) turns readable meanwhile, returns Cancelled at once (the agent's shutdown).
absl::StatusOr<HttpReply> HttpGet(const std::string& url, absl::Duration timeout,
                                  int cancel_fd = -1);

}  // namespace varuna
