#include "agent/local_store.h"

#include <utility>

namespace rayfabric::agent {
namespace {

class PlasmaStore final : public LocalStore {
 public:
  explicit PlasmaStore(std::unique_ptr<plasma::PlasmaClient> client) : client_(std::move(client)) {}

  Result<std::vector<plasma::ObjectBuffer>> Get(const std::vector<ObjectId>& ids,
                                                int64_t timeout_ms) override {
    return client_->Get(ids, timeout_ms);
  }
  Result<plasma::ObjectBuffer> GetOne(const ObjectId& id, int64_t timeout_ms) override {
    return client_->GetOne(id, timeout_ms);
  }
  Status NotSealed(const ObjectId& id, int64_t timeout_ms) const override {
    return client_->NotSealed(id, timeout_ms);
  }
  std::vector<Result<plasma::ObjectBuffer>> CreateMany(
      const std::vector<ObjectId>& ids,
      const std::vector<plasma::CreateOptions>& options) override {
    return client_->CreateMany(ids, options);
  }
  Result<size_t> ReapAbandonedCreates() override { return client_->ReapAbandonedCreates(); }
  size_t abandoned_creates() const override { return client_->abandoned_creates(); }
  std::vector<Status> SealAndRelease(const std::vector<ObjectId>& ids) override {
    return client_->SealAndRelease(ids);
  }
  Status Abort(const ObjectId& id) override { return client_->Abort(id); }
  Status Release(const ObjectId& id) override { return client_->Release(id); }
  Result<bool> Contains(const ObjectId& id) override { return client_->Contains(id); }
  int64_t memory_capacity() const override { return client_->memory_capacity(); }
  bool healthy() const override { return client_->healthy(); }
  std::vector<plasma::SegmentInfo> Segments() const override { return client_->Segments(); }
  void SetSegmentCallbacks(SegmentCallback on_mapped, SegmentCallback on_unmapped) override {
    client_->SetSegmentCallbacks(std::move(on_mapped), std::move(on_unmapped));
  }

 private:
  std::unique_ptr<plasma::PlasmaClient> client_;
};

}  // namespace

StoreConnector PlasmaStoreConnector(std::string socket_path, plasma::ConnectOptions options) {
  return [socket_path = std::move(socket_path),
          options = std::move(options)]() -> Result<std::shared_ptr<LocalStore>> {
    RF_ASSIGN_OR_RETURN(auto client, plasma::PlasmaClient::Connect(socket_path, options));
    return std::shared_ptr<LocalStore>(std::make_shared<PlasmaStore>(std::move(client)));
  };
}

}  // namespace rayfabric::agent
