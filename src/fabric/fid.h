// RAII ownership of libfabric objects: every fid is closed exactly once, in reverse order of
// creation, by whoever owns it.
#pragma once

#include <rdma/fabric.h>

#include <utility>

namespace rayfabric::fabric {

template <typename T>
class Fid {
 public:
  Fid() = default;
  explicit Fid(T* p) : p_(p) {}
  ~Fid() { reset(); }
  Fid(Fid&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  Fid& operator=(Fid&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
    }
    return *this;
  }
  Fid(const Fid&) = delete;
  Fid& operator=(const Fid&) = delete;

  T* get() const { return p_; }
  T** out() {
    reset();
    return &p_;
  }
  void reset() {
    if (p_ != nullptr) fi_close(&p_->fid);
    p_ = nullptr;
  }
  // Gives up ownership without closing (an object that must never be closed, see
  // EngineCore::ResetEndpointLocked).
  T* release() { return std::exchange(p_, nullptr); }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  T* p_ = nullptr;
};

struct InfoDeleter {
  void operator()(struct fi_info* i) const {
    if (i != nullptr) fi_freeinfo(i);
  }
};

}  // namespace rayfabric::fabric
