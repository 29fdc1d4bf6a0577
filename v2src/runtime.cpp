// Status messages and library information (include/aotriton/runtime.h).
#include "aotriton/runtime.h"

#include <string>

#include "status.h"

namespace aotriton {
namespace {

thread_local std::string t_last_message;

}  // namespace

namespace detail {

Status finish(const bridge::Outcome& outcome) noexcept {
  try {
    return fail(static_cast<Status>(outcome.code), std::string(outcome.message).c_str());
  } catch (...) {
    return fail(static_cast<Status>(outcome.code), "");
  }
}

Status fail(Status status, const char* message) noexcept {
  try {
    t_last_message = status == Status::kSuccess ? "" : message;
  } catch (...) {
    // Out of memory while copying a message: keep the status, lose the text.
  }
  return status;
}

}  // namespace detail

const char* last_error_message() noexcept { return t_last_message.c_str(); }

const char* status_name(Status status) noexcept {
  switch (status) {
    case Status::kSuccess: return "kSuccess";
    case Status::kInvalidArgument: return "kInvalidArgument";
    case Status::kDTypeMismatch: return "kDTypeMismatch";
    case Status::kShapeMismatch: return "kShapeMismatch";
    case Status::kBadStrides: return "kBadStrides";
    case Status::kUnsupportedHeadDim: return "kUnsupportedHeadDim";
    case Status::kNullPointer: return "kNullPointer";
    case Status::kMisalignedPointer: return "kMisalignedPointer";
    case Status::kEmptyInput: return "kEmptyInput";
    case Status::kUnsupportedDType: return "kUnsupportedDType";
    case Status::kTooLarge: return "kTooLarge";
    case Status::kUnsupportedVersion: return "kUnsupportedVersion";
    case Status::kUnsupportedByBackend: return "kUnsupportedByBackend";
    case Status::kNoDriver: return "kNoDriver";
    case Status::kDriverError: return "kDriverError";
    case Status::kUnsupportedGpu: return "kUnsupportedGpu";
    case Status::kKernelNotFound: return "kKernelNotFound";
    case Status::kBadArchive: return "kBadArchive";
    case Status::kNoDevice: return "kNoDevice";
    case Status::kUntrustedImages: return "kUntrustedImages";
    case Status::kInternal: return "kInternal";
  }
  return "unknown status";
}

namespace tuning {

Status force_kernel(const char* kernel_id) noexcept {
  return detail::guarded([&] {
    return detail::finish(bridge::tuning_force_kernel(rust::Str(kernel_id ? kernel_id : ""), kernel_id == nullptr));
  });
}

uint64_t forced_count() noexcept { return bridge::tuning_forced_count(); }

void use_database(bool on) noexcept { bridge::tuning_use_database(on); }

bool database_in_use() noexcept { return bridge::tuning_database_in_use(); }

}  // namespace tuning

const char* version() noexcept {
  static const std::string text = [] {
    try {
      rust::String version;
      if (bridge::version(version).code != 0) return std::string("unknown");
      return std::string(version);
    } catch (...) {
      return std::string("unknown");
    }
  }();
  return text.c_str();
}

}  // namespace aotriton
