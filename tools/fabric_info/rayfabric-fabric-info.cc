// rayfabric-fabric-info: the provider the fabric engine would choose on this node, and why.
//
//   rayfabric-fabric-info [--json] [--provider NAME] [--domain NAME] [--require-rdma] [--ip ADDR]
//   rayfabric-fabric-info --settings [--json]
//
// Runs the engine's own selection (rayfabric::fabric::SelectProvider on the RAYFABRIC_*
// configuration, flags override it) without opening anything, and prints ProviderReport::ToString
// (text) or ProviderReport::ToJson (--json, one line). --ip: the node's IP, as an agent listening
// on it gets (its domains are preferred). Exit 0 when a provider was chosen, 1 with
// the selection's error on stderr when none was, 2 on bad usage. --settings: every setting of the
// configuration table instead (doc, type, what it allows, default, value and where it came from;
// exit 1 when one is invalid, saying which). `rayfabric doctor` runs both.
#include <iostream>
#include <string>

#include "rayfabric/config.h"
#include "rayfabric/fabric.h"

namespace {

int Usage(const char* why) {
  if (why) std::cerr << "rayfabric-fabric-info: " << why << "\n";
  std::cerr
      << "usage: rayfabric-fabric-info [--json] [--provider NAME] [--domain NAME] "
         "[--require-rdma] [--ip ADDR]\n"
         "       rayfabric-fabric-info --settings [--json]\n"
         "  Prints the libfabric provider/domain rayfabric's engine would choose here (from the\n"
         "  RAYFABRIC_* settings; flags override them) and why. Exit 0: chosen; 1: none; 2: "
         "usage.\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using rayfabric::Config;
  Config config = Config::FromEnvironment();
  bool json = false;
  bool settings = false;
  rayfabric::fabric::EngineOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    rayfabric::Status s;
    if (a == "--json") {
      json = true;
    } else if (a == "--settings") {
      settings = true;
    } else if (a == "--provider" || a == "--domain") {
      const char* v = value();
      if (!v) return Usage((a + " needs a value").c_str());
      s = config.Set(a.substr(2), v);
    } else if (a == "--ip") {
      const char* v = value();
      if (!v) return Usage("--ip needs a value");
      options.preferred_ip = v;
    } else if (a == "--require-rdma") {
      s = config.Set("require_rdma", "true");
    } else if (a == "-h" || a == "--help") {
      Usage(nullptr);
      return 0;
    } else {
      return Usage(("unknown argument " + a).c_str());
    }
    if (!s.ok()) {
      std::cerr << "rayfabric-fabric-info: " << s << "\n";
      return 2;
    }
  }
  if (settings) {
    std::cout << (json ? config.ListingJson() + "\n" : config.Listing());
    const rayfabric::Status valid = config.Validate();
    if (!valid.ok()) std::cerr << "rayfabric-fabric-info: " << valid << "\n";
    return valid.ok() ? 0 : 1;
  }
  auto report = rayfabric::fabric::SelectProvider(config, options);
  if (!report.ok()) {
    std::cerr << "rayfabric-fabric-info: no provider: " << report.status() << "\n";
    return 1;
  }
  if (json) {
    std::cout << report->ToJson() << "\n";
  } else {
    std::cout << report->ToString();
  }
  return 0;
}
