// kvtier-run's command line: --device parsing and help, and a --device the build or machine
// cannot serve failing as a usage error (exit 2) that names the flag. Uses the tiny synthetic
// model, so it needs neither the download nor a GPU.

#include "engine/cli/cli.h"

#include <cstdio>

#include "engine/cli/open_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/tiny_model.h"

namespace kvtier::engine {
namespace {

using ::testing::HasSubstr;

struct Cli {
  CLI::App app{"kvtier-run"};
  CliArgs args;
  Cli() { DeclareCli(app, args); }
  // Parses `argv` (without the program name), as CLI11_PARSE would.
  void Parse(std::vector<std::string> argv) {
    std::reverse(argv.begin(), argv.end());
    app.parse(argv);
  }
};

std::string TinyModel() {
  const std::string path = ::testing::TempDir() + "/cli_tiny.gguf";
  tiny::WriteModel(path, tiny::MakeWeights(3));
  return path;
}

TEST(CliTest, DeviceDefaultsToCpuAndTheHelpSaysSo) {
  Cli cli;
  cli.Parse({"generate", "--prompt", "hi"});
  EXPECT_EQ(cli.args.device, "cpu");
  const std::string help = cli.app.get_subcommand("generate")->help();
  EXPECT_THAT(help, HasSubstr("--device"));
  EXPECT_THAT(help, HasSubstr("cpu (default) | cuda"));
}

TEST(CliTest, DeviceTakesCudaAndRejectsOtherNames) {
  Cli cuda;
  cuda.Parse({"generate", "--prompt", "hi", "--device", "cuda"});
  EXPECT_EQ(cuda.args.device, "cuda");
  Cli gpu;
  EXPECT_THROW(gpu.Parse({"generate", "--prompt", "hi", "--device", "gpu"}), CLI::ParseError);
  EXPECT_EQ(ParseDevice("gpu").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ParseDevice("gpu").status().message(), HasSubstr("--device 'gpu'"));
}

TEST(CliTest, CudaThatCannotBeServedExitsTwoNamingTheFlag) {
  const std::string model = TinyModel();
  Cli cli;
  cli.Parse({"--model", model, "generate", "--prompt", "ab", "--local", "--device", "cuda",
             "--max-new-tokens", "2", "--json"});
  ::testing::internal::CaptureStderr();
  ::testing::internal::CaptureStdout();
  const int code = RunCli(cli.app, cli.args);
  const std::string err = ::testing::internal::GetCapturedStderr();
  ::testing::internal::GetCapturedStdout();
  std::remove(model.c_str());
  if (code == 0) GTEST_SKIP() << "this build and machine serve --device cuda";
  EXPECT_EQ(code, 2) << err;
  EXPECT_THAT(err, HasSubstr("kvtier-run: --device cuda: "));
  // Why: no CUDA in the build, no device, or no CUDA store backend in the runtime.
  EXPECT_THAT(err, HasSubstr(BuiltWithCudaEngine() ? "CUDA" : "built without CUDA")) << err;
}

TEST(CliTest, CudaSetupFailsBeforeAnyRunWithFailedPrecondition) {
  const std::string model_path = TinyModel();
  auto model = Model::Load(model_path, {.threads = 1});
  ASSERT_TRUE(model.ok()) << model.status();
  GenerateOptions options{.prompt = "ab", .device = Device::kCuda};
  absl::StatusOr<DeviceSetup> setup = SetUpDevice(**model, options);
  std::remove(model_path.c_str());
  if (setup.ok()) GTEST_SKIP() << "this build and machine serve --device cuda";
  EXPECT_EQ(setup.status().code(), absl::StatusCode::kFailedPrecondition) << setup.status();
  EXPECT_THAT(setup.status().message(), HasSubstr("--device cuda: "));
}

TEST(CliTest, CpuDeviceGeneratesWithTheTinyModel) {
  const std::string model = TinyModel();
  Cli cli;
  cli.Parse({"--model", model, "--threads", "1", "generate", "--prompt", "ab", "--local",
             "--max-new-tokens", "3", "--json"});
  ::testing::internal::CaptureStdout();
  const int code = RunCli(cli.app, cli.args);
  const std::string out = ::testing::internal::GetCapturedStdout();
  std::remove(model.c_str());
  EXPECT_EQ(code, 0);
  EXPECT_THAT(out, HasSubstr("\"prompt_tokens\""));
}

}  // namespace
}  // namespace kvtier::engine
