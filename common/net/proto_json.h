#pragma once

// Protobuf JSON as every varuna interface prints it (varunactl -o json, the HTTP API, the
// worker's step lines): field names as in the .proto, enums by name, default values included.

#include <string>

namespace google::protobuf {
class Message;
}

namespace varuna {

std::string ProtoJson(const google::protobuf::Message& m);

}  // namespace varuna
