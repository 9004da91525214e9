// What the profile of each provider says about it (keys, access, progress, endpoint names), from
// an fi_info entry as libfabric fills it: the provider traits table, row by row, and the user's
// FI_* variables that change a row's answer. The entries are real fi_info structures
// (fi_allocinfo) named as libfabric names its providers; no provider is opened.
#include <gtest/gtest.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "fabric/provider.h"

namespace rayfabric::fabric {
namespace {

struct InfoFree {
  void operator()(struct fi_info* info) const { fi_freeinfo(info); }
};

ProviderProfile ProfileOf(const std::string& provider, uint64_t mr_mode = 0,
                          enum fi_progress progress = FI_PROGRESS_MANUAL, uint64_t caps = 0) {
  std::unique_ptr<struct fi_info, InfoFree> info(fi_allocinfo());
  info->fabric_attr->prov_name = strdup(provider.c_str());
  info->fabric_attr->name = strdup("fabric0");
  info->domain_attr->name = strdup("dom0");
  info->domain_attr->mr_mode = static_cast<int>(mr_mode);
  info->domain_attr->data_progress = progress;
  info->caps = caps;
  return ProfileFromInfo(info.get());
}

// Sets FI_* variables for one test and puts back what was there.
class FiEnv {
 public:
  FiEnv(std::initializer_list<std::pair<const char*, const char*>> values) {
    for (const auto& [name, value] : values) {
      const char* old = std::getenv(name);
      // The first value seen is the one put back (a name listed twice saves it once).
      saved_.emplace(name, old ? std::optional<std::string>(old) : std::nullopt);
      if (value) {
        setenv(name, value, 1);
      } else {
        unsetenv(name);
      }
    }
  }
  ~FiEnv() {
    for (const auto& [name, old] : saved_) {
      if (old) {
        setenv(name.c_str(), old->c_str(), 1);
      } else {
        unsetenv(name.c_str());
      }
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

TEST(ProviderTraits, VerbsCachesRegistrationsUnlessTheCacheIsOff) {
  FiEnv env({{"FI_MR_CACHE_MONITOR", nullptr},
             {"FI_MR_CACHE_MAX_COUNT", nullptr},
             {"FI_MR_CUDA_CACHE_MONITOR_ENABLED", nullptr}});
  ProviderProfile cached = ProfileOf("verbs;ofi_rxm", FI_MR_LOCAL | FI_MR_PROV_KEY);
  EXPECT_TRUE(cached.rdma);
  EXPECT_TRUE(cached.mr_cache);
  EXPECT_FALSE(cached.deregistration_revokes_keys);
  EXPECT_FALSE(cached.enforces_access);
  EXPECT_TRUE(cached.checks_remote_keys);
  EXPECT_TRUE(cached.bytes_move_without_progress);  // the NIC moves the bytes
  {
    FiEnv off({{"FI_MR_CACHE_MONITOR", "disabled"}});
    ProviderProfile p = ProfileOf("verbs;ofi_rxm");
    EXPECT_FALSE(p.mr_cache);
    EXPECT_TRUE(p.deregistration_revokes_keys);
    EXPECT_TRUE(p.enforces_access);
    EXPECT_NE(p.key_lifetime.find("FI_MR_CACHE_MONITOR=disabled"), std::string::npos);
    // Device memory has a cache monitor of its own, which that variable leaves on.
    ProviderProfile device = ProfileOf("verbs;ofi_rxm", 0, FI_PROGRESS_MANUAL, FI_HMEM);
    EXPECT_TRUE(device.mr_cache);
    EXPECT_FALSE(device.deregistration_revokes_keys);
    FiEnv cuda_off({{"FI_MR_CUDA_CACHE_MONITOR_ENABLED", "0"}});
    EXPECT_TRUE(
        ProfileOf("verbs;ofi_rxm", 0, FI_PROGRESS_MANUAL, FI_HMEM).deregistration_revokes_keys);
  }
  FiEnv no_entries({{"FI_MR_CACHE_MAX_COUNT", "0"}});
  EXPECT_TRUE(ProfileOf("verbs;ofi_rxm").deregistration_revokes_keys);
}

TEST(ProviderTraits, DatagramUtilityVerifiesItsOwnKeys) {
  FiEnv env({{"FI_MR_CACHE_MONITOR", nullptr}, {"FI_MR_CACHE_MAX_COUNT", nullptr}});
  for (const char* name : {"verbs;ofi_rxd", "udp;ofi_rxd"}) {
    ProviderProfile p = ProfileOf(name);
    EXPECT_FALSE(p.mr_cache) << name;
    EXPECT_TRUE(p.deregistration_revokes_keys) << name;
    EXPECT_NE(p.key_lifetime.find("ofi_rxd"), std::string::npos) << name;
  }
  EXPECT_TRUE(ProfileOf("verbs;ofi_rxd").rdma);
  EXPECT_FALSE(ProfileOf("udp;ofi_rxd").rdma);
}

TEST(ProviderTraits, EfaCachesOnlyWithoutLocalDescriptors) {
  FiEnv env({{"FI_EFA_MR_CACHE_ENABLE", nullptr}});
  ProviderProfile local = ProfileOf("efa", FI_MR_LOCAL);
  EXPECT_TRUE(local.rdma);
  EXPECT_FALSE(local.mr_cache);
  EXPECT_TRUE(local.deregistration_revokes_keys);
  ProviderProfile cached = ProfileOf("efa", FI_MR_PROV_KEY);
  EXPECT_TRUE(cached.mr_cache);
  EXPECT_FALSE(cached.deregistration_revokes_keys);
  FiEnv off({{"FI_EFA_MR_CACHE_ENABLE", "no"}});
  EXPECT_TRUE(ProfileOf("efa", FI_MR_PROV_KEY).deregistration_revokes_keys);
}

TEST(ProviderTraits, SocketProvidersVerifyKeysAndAccess) {
  for (const char* name : {"tcp;ofi_rxm", "tcp", "net", "sockets"}) {
    ProviderProfile p = ProfileOf(name);
    EXPECT_FALSE(p.rdma) << name;
    EXPECT_TRUE(p.checks_remote_keys) << name;
    EXPECT_TRUE(p.deregistration_revokes_keys) << name;
    EXPECT_TRUE(p.enforces_access) << name;
    EXPECT_FALSE(p.names_endpoint_by_pid) << name;
  }
  // tcp and net move bytes only inside this process's libfabric calls (manual progress);
  // sockets has a progress thread of its own.
  EXPECT_FALSE(ProfileOf("tcp;ofi_rxm").bytes_move_without_progress);
  EXPECT_FALSE(ProfileOf("net").bytes_move_without_progress);
  EXPECT_TRUE(ProfileOf("tcp;ofi_rxm", 0, FI_PROGRESS_AUTO).bytes_move_without_progress);
  EXPECT_TRUE(ProfileOf("sockets").bytes_move_without_progress);
}

TEST(ProviderTraits, SharedMemoryChecksNothingAndNamesEndpointsByPid) {
  ProviderProfile p = ProfileOf("shm");
  EXPECT_FALSE(p.rdma);
  EXPECT_FALSE(p.checks_remote_keys);
  EXPECT_FALSE(p.deregistration_revokes_keys);
  EXPECT_FALSE(p.enforces_access);
  EXPECT_TRUE(p.names_endpoint_by_pid);
}

TEST(ProviderTraits, ProvidersNotCheckedPromiseNothing) {
  for (const char* name : {"psm3", "cxi", "opx", "some_new_provider"}) {
    ProviderProfile p = ProfileOf(name);
    EXPECT_FALSE(p.deregistration_revokes_keys) << name;
    EXPECT_FALSE(p.enforces_access) << name;
    EXPECT_NE(p.key_lifetime.find("not known"), std::string::npos) << name;
  }
  EXPECT_TRUE(ProfileOf("psm3").rdma);
  EXPECT_FALSE(ProfileOf("some_new_provider").rdma);
}

TEST(ProviderTraits, AnUnlistedUtilityCombinationTakesItsCoresTraits) {
  // Not in the ranking, so neither ranked nor RDMA; its keys are its core provider's.
  ProviderProfile p = ProfileOf("sockets;ofi_rxm");
  EXPECT_FALSE(p.rdma);
  EXPECT_TRUE(p.deregistration_revokes_keys);
  EXPECT_TRUE(p.enforces_access);
  EXPECT_FALSE(ProfileOf("net;ofi_rxm").bytes_move_without_progress);
  // verbs has rows only as combinations: another one gets the verbs MR cache's answers.
  FiEnv env({{"FI_MR_CACHE_MONITOR", nullptr}, {"FI_MR_CACHE_MAX_COUNT", nullptr}});
  ProviderProfile verbs = ProfileOf("verbs;ofi_foo");
  EXPECT_FALSE(verbs.rdma);
  EXPECT_TRUE(verbs.mr_cache);
  FiEnv off({{"FI_MR_CACHE_MONITOR", "disabled"}});
  EXPECT_TRUE(ProfileOf("verbs;ofi_foo").deregistration_revokes_keys);
  EXPECT_FALSE(ProfileOf("shm;ofi_rxd").names_endpoint_by_pid);
}

}  // namespace
}  // namespace rayfabric::fabric
