// nn::Model, the interface every caller trains a model through:
//  - a model of the user's own that overrides only forward() and name() gets the documented
//    defaults: cross-entropy of its logits as the loss (the same value and gradients), the generic
//    kernels whatever the device, dtype and size, no recompute (off is accepted, on refused), no
//    batch statistics;
//  - the library's models (the seed MLP, the CNN) answer the same questions through it.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cumulus/core/error.h"
#include "cumulus/models/cnn.h"
#include "cumulus/models/mlp.h"
#include "cumulus/nn/layers.h"
#include "cumulus/nn/model.h"
#include "cumulus/ops/fused_mlp.h"
#include "cumulus/ops/loss.h"
#include "test_util.h"

namespace cumulus {
namespace {

using nn::KernelChoice;
using testing::DeviceTest;

// A user's model, as small as one can be: 4 inputs, 3 classes.
class TinyModel : public nn::Model {
 public:
  TinyModel(Generator& gen, Device device) {
    fc_ = register_module("fc", std::make_shared<nn::Linear>(4, 3, gen, device));
  }
  Tensor forward(const Tensor& x) override { return fc_->forward(x); }
  std::string name() const override { return "tiny"; }

 private:
  std::shared_ptr<nn::Linear> fc_;
};

std::vector<float> host(const Tensor& t) { return t.to(Device::cpu()).to_vector<float>(); }

// The loss's value and every parameter's gradient after its backward.
std::vector<std::vector<float>> value_and_gradients(nn::Model& model, const Tensor& loss) {
  loss.backward();
  std::vector<std::vector<float>> out{host(loss)};
  for (const Tensor& p : model.parameters()) out.push_back(host(p.grad()));
  model.zero_grad();
  return out;
}

class ModelTest : public DeviceTest {};

TEST_P(ModelTest, UserModelLossIsCrossEntropyOfItsLogits) {
  Generator gen(5);
  TinyModel model(gen, device());
  nn::Model& as_model = model;  // what a trainer holds
  const Tensor x = uniform(Shape{6, 4}, -1.0f, 1.0f, gen, device());
  const Tensor y = Tensor::from_vector<int32_t>({0, 2, 1, 1, 0, 2}, Shape{6}, device());
  for (ops::Reduction reduction : {ops::Reduction::Sum, ops::Reduction::Mean}) {
    const auto by_interface = value_and_gradients(model, as_model.loss(x, y, reduction));
    const auto by_hand = value_and_gradients(model, ops::cross_entropy(model(x), y, reduction));
    EXPECT_EQ(by_interface, by_hand) << "the same ops on the same inputs: the same bits";
  }
}

TEST(Model, UserModelRunsTheGenericKernels) {
  Generator gen(1);
  TinyModel model(gen, Device::cpu());
  nn::Model& m = model;
  for (KernelChoice choice : {KernelChoice::automatic, KernelChoice::generic}) {
    EXPECT_EQ(&m.set_kernels(choice), &m);
    for (Device device : {Device::cpu(), Device::cuda(0)})
      for (DType dtype : {DType::f32, DType::bf16, DType::f16})
        for (int64_t batch : {1, 16, 64, 4096})
          EXPECT_EQ(m.kernels_for(device, dtype, batch), KernelChoice::generic)
              << kernel_choice_name(choice) << " " << device.str() << " " << dtype_name(dtype) << " " << batch;
  }
  try {
    m.set_kernels(KernelChoice::fused);
    ADD_FAILURE() << "a model without fused kernels took KernelChoice::fused";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("tiny"), std::string::npos) << e.what();
  }
  EXPECT_EQ(m.kernels_for(Device::cuda(0), DType::f32, 16), KernelChoice::generic);
}

TEST(Model, UserModelRefusesRecomputeAndHasNoBatchStatistics) {
  Generator gen(1);
  TinyModel model(gen, Device::cpu());
  nn::Model& m = model;
  EXPECT_FALSE(m.offers_recompute());
  EXPECT_EQ(&m.set_recompute(false), &m) << "off is what it does anyway";
  try {
    m.set_recompute(true);
    ADD_FAILURE() << "a model without recompute accepted set_recompute(true)";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("tiny"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(m.recompute());
  EXPECT_FALSE(m.uses_batch_statistics());
  EXPECT_EQ(m.name(), "tiny");
}

TEST(Model, SeedMLPAnswersThroughTheInterface) {
  Generator gen(2);
  models::SeedMLP mlp(gen);
  nn::Model& m = mlp;
  EXPECT_EQ(m.name(), "seed_mlp");
  EXPECT_FALSE(m.uses_batch_statistics());
  // Automatic: the fused op on CUDA in f32 up to kFusedAutoMaxBatch, with recompute off, once a GPU
  // has measured its kernels; the generic ops until then.
  const int64_t most = models::SeedMLP::kFusedAutoMaxBatch;
  EXPECT_EQ(m.kernels_for(Device::cuda(0), DType::f32, most),
            ops::kFusedMlpMeasuredOnGpu ? KernelChoice::fused : KernelChoice::generic);
  EXPECT_EQ(m.kernels_for(Device::cuda(0), DType::f32, most + 1), KernelChoice::generic);
  EXPECT_EQ(m.kernels_for(Device::cuda(0), DType::bf16, 16), KernelChoice::generic);
  EXPECT_EQ(m.kernels_for(Device::cpu(), DType::f32, 16), KernelChoice::generic);
  ASSERT_TRUE(m.offers_recompute());
  m.set_recompute(true);
  EXPECT_TRUE(m.recompute());
  EXPECT_EQ(m.kernels_for(Device::cuda(0), DType::f32, 16), KernelChoice::generic);
  m.set_recompute(false);
  EXPECT_FALSE(m.recompute());
  m.set_kernels(KernelChoice::fused);
  EXPECT_EQ(m.kernels_for(Device::cpu(), DType::f32, 1024), KernelChoice::fused);
}

TEST(Model, CNNAnswersThroughTheInterface) {
  Generator gen(3);
  models::CNN cnn(gen);
  nn::Model& m = cnn;
  EXPECT_EQ(m.name(), "cnn");
  EXPECT_TRUE(m.uses_batch_statistics());
  EXPECT_EQ(m.kernels_for(Device::cuda(0), DType::f32, 16), KernelChoice::generic);
  EXPECT_THROW(m.set_kernels(KernelChoice::fused), InvalidArgument);
  ASSERT_TRUE(m.offers_recompute());
  m.set_recompute(true);
  EXPECT_TRUE(m.recompute());
  EXPECT_TRUE(cnn.recompute_segments() == models::CNN::recompute_segments_default());
  m.set_recompute(false);
  EXPECT_TRUE(cnn.recompute_segments().empty());
}

CUMULUS_INSTANTIATE_DEVICES(ModelTest);

}  // namespace
}  // namespace cumulus
