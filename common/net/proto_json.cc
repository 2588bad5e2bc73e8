#include "common/net/proto_json.h"

#include "google/protobuf/message.h"
#include "google/protobuf/util/json_util.h"

namespace varuna {

std::string ProtoJson(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  opts.always_print_primitive_fields = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(m, &out, opts);
  return out;
}

}  // namespace varuna
