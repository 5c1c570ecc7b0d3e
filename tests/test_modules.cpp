// Modules written as a PyTorch user writes them (issue 59): a forward with its own arguments called
// as the module (CustomModule, Note [Forward with any arguments] in nn/module.h), ModuleList's
// names and typed access, and buffers kept out of the state dict (persistent false).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "cumulus/nn/layers.h"
#include "cumulus/nn/module.h"
#include "cumulus/ops/pointwise.h"
#include "test_util.h"

namespace cumulus::testing {
namespace {

// A block given x and a table as arguments, as a transformer block is given the rotary tables;
// the table is also a non-persistent buffer of its own, as the model's are.
class Block : public nn::CustomModule<Block> {
 public:
  Block(Generator& gen, Device device) {
    proj = register_module("proj", std::make_shared<nn::Linear>(3, 3, gen, device, false));
    scale = register_buffer("scale", Tensor::full({3}, 2.0f, DType::f32, device), device, /*persistent=*/false);
    steps = register_buffer("steps", Tensor::zeros({1}, DType::f32, device), device);
  }
  Tensor forward(const Tensor& x, const Tensor& table) { return ops::mul(ops::mul((*proj)(x), table), scale); }

  std::shared_ptr<nn::Linear> proj;
  Tensor scale, steps;
};

class Model : public nn::Module {
 public:
  Model(Generator& gen, Device device) {
    layers = register_module("layers", std::make_shared<nn::ModuleList>());
    for (int i = 0; i < 2; ++i) layers->add(std::make_shared<Block>(gen, device));
  }
  Tensor forward(const Tensor& x) override {
    const Tensor table = Tensor::full(x.shape(), 0.5f, DType::f32, x.device());
    Tensor h = x;
    for (std::size_t i = 0; i < layers->size(); ++i) h = layers->at<Block>(i)(h, table);
    return h;
  }
  std::shared_ptr<nn::ModuleList> layers;
};

class ModulesTest : public DeviceTest {};

TEST_P(ModulesTest, ACustomForwardIsCalledAsTheModule) {
  Generator gen(1);
  Block block(gen, device());
  const Tensor x = Tensor::full({2, 3}, 1.0f, DType::f32, device());
  const Tensor table = Tensor::full({2, 3}, 3.0f, DType::f32, device());
  const Tensor want = ops::mul(ops::mul((*block.proj)(x), table), 2.0f);
  EXPECT_EQ(block(x, table).to(Device::cpu()).to_vector<float>(), want.to(Device::cpu()).to_vector<float>());
  // No one-tensor forward: said by name where a Sequential would call it.
  nn::Module& as_module = block;
  try {
    as_module(x);
    ADD_FAILURE() << "the one-tensor forward ran";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("Block"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no one-tensor forward"), std::string::npos) << e.what();
  }
}

TEST_P(ModulesTest, ModuleListNamesItsModulesByIndex) {
  Generator gen(2);
  Model model(gen, device());
  std::vector<std::string> names;
  for (const auto& [name, t] : model.named_parameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"layers.0.proj.weight", "layers.1.proj.weight"}));
  EXPECT_EQ(model.forward(Tensor::full({2, 3}, 1.0f, DType::f32, device())).shape(), Shape({2, 3}));
  EXPECT_EQ(model.layers->size(), 2u);
  std::size_t count = 0;
  for (const auto& layer : *model.layers) count += layer != nullptr;
  EXPECT_EQ(count, 2u);
  EXPECT_THROW(model.layers->at<nn::Linear>(0), InvalidArgument);
  EXPECT_THROW((*model.layers)[2], InvalidArgument);
  EXPECT_THROW((*model.layers)(Tensor::full({3}, 1.0f, DType::f32, device())), InvalidArgument);  // no forward
}

TEST_P(ModulesTest, NonPersistentBuffersStayOutOfTheStateDict) {
  Generator gen(3);
  Model model(gen, device());
  std::vector<std::string> buffers, state;
  for (const auto& [name, t] : model.named_buffers()) buffers.push_back(name);
  for (const auto& [name, t] : model.state_dict()) state.push_back(name);
  EXPECT_EQ(buffers,
            (std::vector<std::string>{"layers.0.scale", "layers.0.steps", "layers.1.scale", "layers.1.steps"}));
  // PyTorch's order: a module's own parameters and buffers, then its children's.
  EXPECT_EQ(state, (std::vector<std::string>{"layers.0.steps", "layers.0.proj.weight", "layers.1.steps",
                                             "layers.1.proj.weight"}));
}

CUMULUS_INSTANTIATE_DEVICES(ModulesTest);

}  // namespace
}  // namespace cumulus::testing
