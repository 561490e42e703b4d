// validate_test.cc: mep_tensor_check's device rules (type and, for CUDA, the
// group's device id), dtype and shape messages, and mep_tensors_disjoint's
// refusal of a written tensor that shares memory, without a GPU.
#include <string>

#include "gtest/gtest.h"

extern "C" {
#include "runtime/error.h"
#include "runtime/validate.h"
}

namespace {

struct Desc {
  int64_t shape[2] = {4, 8};
  moe_ep_tensor_t t{};
  uint16_t data[32] = {};
  Desc(int type, int id) {
    t.data = data;
    t.device = {type, id};
    t.ndim = 2;
    t.dtype = {MOE_EP_DTYPE_BFLOAT, 16, 1};
    t.shape = shape;
  }
};

mep_tensor_rule_t Rule(int device) {
  return mep_tensor_rule_t{"dispatch", "params->x", device, MEP_BIT(MEP_DT_BF16), 2, {4, 8, 0}, 0};
}

moe_ep_status_t Check(const Desc& d, const mep_tensor_rule_t& r) {
  void* data = nullptr;
  int dt = -1;
  return mep_tensor_check(&d.t, &r, &data, &dt);
}

TEST(ValidateTest, CudaTensorOnTheGroupsDeviceIsAccepted) {
  Desc d(MOE_EP_DEVICE_CUDA, 1);
  EXPECT_EQ(Check(d, Rule(MEP_DEVICE(MOE_EP_DEVICE_CUDA, 1))), MOE_EP_OK) << mep_last_error();
}

TEST(ValidateTest, CudaTensorOnAnotherDeviceNamesBothIds) {
  Desc d(MOE_EP_DEVICE_CUDA, 0);
  EXPECT_EQ(Check(d, Rule(MEP_DEVICE(MOE_EP_DEVICE_CUDA, 1))), MOE_EP_ERR_INVALID_ARGUMENT);
  const std::string msg = mep_last_error();
  EXPECT_NE(msg.find("params->x has device_id=0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("CUDA device 1"), std::string::npos) << msg;
}

TEST(ValidateTest, AnyDeviceIdWhenTheRuleSaysAny) {
  Desc d(MOE_EP_DEVICE_CUDA, 5);
  EXPECT_EQ(Check(d, Rule(MEP_DEVICE(MOE_EP_DEVICE_CUDA, -1))), MOE_EP_OK) << mep_last_error();
}

TEST(ValidateTest, HostRuleAcceptsPinnedHostAndRefusesDeviceMemory) {
  Desc pinned(MOE_EP_DEVICE_CUDA_HOST, 0);
  EXPECT_EQ(Check(pinned, Rule(MEP_DEVICE(MOE_EP_DEVICE_CPU, -1))), MOE_EP_OK) << mep_last_error();
  Desc dev(MOE_EP_DEVICE_CUDA, 0);
  EXPECT_EQ(Check(dev, Rule(MEP_DEVICE(MOE_EP_DEVICE_CPU, -1))), MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mep_last_error()).find("needs host memory"), std::string::npos)
      << mep_last_error();
}

TEST(ValidateTest, WrongDtypeAndShapeAreNamed) {
  Desc d(MOE_EP_DEVICE_CUDA, 0);
  d.t.dtype = {MOE_EP_DTYPE_FLOAT, 32, 1};
  EXPECT_EQ(Check(d, Rule(MEP_DEVICE(MOE_EP_DEVICE_CUDA, 0))), MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mep_last_error()).find("dtype"), std::string::npos) << mep_last_error();
  Desc s(MOE_EP_DEVICE_CUDA, 0);
  s.shape[1] = 9;
  EXPECT_EQ(Check(s, Rule(MEP_DEVICE(MOE_EP_DEVICE_CUDA, 0))), MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mep_last_error()).find("shape"), std::string::npos) << mep_last_error();
}

// A dtype no rule takes is named as DLPack names it, so the caller reads
// "float16" and not only its codes.
TEST(ValidateTest, DtypeNoRuleTakesIsNamedByItsDlpackName) {
  const struct {
    moe_ep_data_type_t dtype;
    const char* name;
  } cases[] = {
      {{MOE_EP_DTYPE_FLOAT, 16, 1}, "= float16; it must be bf16"},
      {{MOE_EP_DTYPE_INT, 8, 1}, "= int8; it must be bf16"},
      {{MOE_EP_DTYPE_BFLOAT, 16, 2}, "= bfloat16x2; it must be bf16"},
      {{12, 8, 1}, "= float8_e5m2; it must be bf16"},
      {{6, 8, 1}, "= bool; it must be bf16"},
      {{3, 64, 1}, "= opaque_handle; it must be bf16"},
      {{200, 8, 1}, "= a type DLPack does not define; it must be bf16"},
      {{MOE_EP_DTYPE_FLOAT, 32, 1}, "(code=2, bits=32, lanes=1) = float32; it must be bf16"},
  };
  for (const auto& c : cases) {
    Desc d(MOE_EP_DEVICE_CUDA, 0);
    d.t.dtype = c.dtype;
    EXPECT_EQ(Check(d, Rule(MEP_DEVICE(MOE_EP_DEVICE_CUDA, 0))), MOE_EP_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(mep_last_error()).find(c.name), std::string::npos)
        << "code " << int(c.dtype.code) << ": " << mep_last_error();
  }
}

// An open dimension (-1 in the rule: HT recv_x rows, a worst-case y) is the
// caller's number. A shape whose byte count wraps must not pass as an empty
// tensor with NULL data, nor as a real one.
TEST(ValidateTest, ShapeWhoseSizeWrapsIsRefusedNotTakenForEmpty) {
  Desc d(MOE_EP_DEVICE_CPU, -1);
  d.shape[0] = int64_t{1} << 50;
  d.shape[1] = 16384;
  d.t.data = nullptr;
  mep_tensor_rule_t r{"dispatch", "params->recv_x", MEP_DEVICE(MOE_EP_DEVICE_CPU, -1),
                      MEP_BIT(MEP_DT_BF16), 2, {-1, 16384, 0}, 1};
  EXPECT_EQ(Check(d, r), MOE_EP_ERR_INVALID_ARGUMENT);
  const std::string msg = mep_last_error();
  EXPECT_NE(msg.find("params->recv_x has shape [1125899906842624, 16384], whose size in bytes "
                     "does not fit in 63 bits"),
            std::string::npos)
      << msg;
  d.t.data = d.data;
  EXPECT_EQ(Check(d, r), MOE_EP_ERR_INVALID_ARGUMENT) << "with data";
}

// data + byte_offset + the tensor's bytes must be memory: a byte_offset
// that wraps the address space (-16: 16 bytes before data) or a span that
// runs past its top is refused, naming the tensor and the numbers.
TEST(ValidateTest, ByteOffsetOrSpanThatWrapsTheAddressSpaceIsRefused) {
  const mep_tensor_rule_t r = Rule(MEP_DEVICE(MOE_EP_DEVICE_CPU, -1));
  Desc d(MOE_EP_DEVICE_CPU, -1);
  d.t.byte_offset = ~uint64_t{15};
  EXPECT_EQ(Check(d, r), MOE_EP_ERR_INVALID_ARGUMENT);
  std::string msg = mep_last_error();
  EXPECT_NE(msg.find("dispatch: params->x data"), std::string::npos) << msg;
  EXPECT_NE(msg.find("byte_offset 18446744073709551600 + 64 bytes wraps the address space"),
            std::string::npos)
      << msg;
  // The last 64 bytes below the top of the address space: data + 64 wraps.
  d.t.byte_offset = 0;
  d.t.data = reinterpret_cast<void*>(~uintptr_t{63} + 16);
  EXPECT_EQ(Check(d, r), MOE_EP_ERR_INVALID_ARGUMENT);
  msg = mep_last_error();
  EXPECT_NE(msg.find("+ byte_offset 0 + 64 bytes wraps"), std::string::npos) << msg;
  // The boundary, with 1-byte elements (no alignment in the way): 32
  // bytes ending on the last byte of the address space are taken; one
  // byte higher, the end is past it.
  mep_tensor_rule_t bytes_rule{"prepare", "params->is_token_in_rank",
                               MEP_DEVICE(MOE_EP_DEVICE_CPU, -1), MEP_BIT(MEP_DT_U8), 2,
                               {4, 8, 0}, 0};
  Desc u8(MOE_EP_DEVICE_CPU, -1);
  u8.t.dtype = {MOE_EP_DTYPE_UINT, 8, 1};
  u8.t.data = reinterpret_cast<void*>(~uintptr_t{0} - 32);
  void* got = nullptr;
  int got_dt = -1;
  EXPECT_EQ(mep_tensor_check(&u8.t, &bytes_rule, &got, &got_dt), MOE_EP_OK) << mep_last_error();
  u8.t.byte_offset = 1;
  EXPECT_EQ(mep_tensor_check(&u8.t, &bytes_rule, &got, &got_dt), MOE_EP_ERR_INVALID_ARGUMENT);
  msg = mep_last_error();
  EXPECT_NE(msg.find("params->is_token_in_rank data"), std::string::npos) << msg;
  EXPECT_NE(msg.find("+ byte_offset 1 + 32 bytes wraps"), std::string::npos) << msg;
  // An ordinary offset inside the allocation is taken.
  Desc ok(MOE_EP_DEVICE_CPU, -1);
  ok.shape[0] = 2;
  ok.t.byte_offset = 32;
  mep_tensor_rule_t open = r;
  open.shape[0] = -1;
  void* data = nullptr;
  int dt = -1;
  ASSERT_EQ(mep_tensor_check(&ok.t, &open, &data, &dt), MOE_EP_OK) << mep_last_error();
  EXPECT_EQ(data, reinterpret_cast<char*>(ok.data) + 32);
}

TEST(ValidateTest, EmptyTensorMayHaveNullDataWhenTheRuleAllowsIt) {
  Desc d(MOE_EP_DEVICE_CPU, -1);
  d.shape[0] = 0;
  d.shape[1] = 16384;
  d.t.data = nullptr;
  mep_tensor_rule_t r{"dispatch", "params->recv_x", MEP_DEVICE(MOE_EP_DEVICE_CPU, -1),
                      MEP_BIT(MEP_DT_BF16), 2, {-1, 16384, 0}, 1};
  EXPECT_EQ(Check(d, r), MOE_EP_OK) << mep_last_error();
  r.allow_null_data = 0;
  EXPECT_EQ(Check(d, r), MOE_EP_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mep_last_error()).find("params->recv_x->data is NULL"), std::string::npos)
      << mep_last_error();
}

// Views of one 64-element bf16 buffer: [rows, 8] from element `first`.
struct View {
  int64_t shape[2];
  moe_ep_tensor_t t{};
  View(uint16_t* base, int first, int rows) : shape{rows, 8} {
    t.data = base;
    t.byte_offset = static_cast<uint64_t>(first) * 2u;
    t.device = {MOE_EP_DEVICE_CPU, 0};
    t.ndim = 2;
    t.dtype = {MOE_EP_DTYPE_BFLOAT, 16, 1};
    t.shape = shape;
  }
};

TEST(ValidateTest, WrittenTensorSharingAByteWithAnotherIsRefusedNamingBoth) {
  uint16_t buf[64] = {};
  View y(buf, 0, 4), out_same(buf, 0, 4), out_tail(buf, 31, 4), out_after(buf, 32, 4);
  mep_named_tensor_t ts[] = {{"params->y", &y.t, 0}, {"params->out", &out_same.t, 1}};
  ASSERT_EQ(mep_tensors_disjoint("combine", ts, 2), MOE_EP_ERR_INVALID_ARGUMENT);
  const std::string msg = mep_last_error();
  EXPECT_NE(msg.find("combine: params->y (bytes "), std::string::npos) << msg;
  EXPECT_NE(msg.find("the call writes params->out while it reads params->y"), std::string::npos)
      << msg;
  // One element in common (y's last, out's first) is enough.
  ts[1].t = &out_tail.t;
  EXPECT_EQ(mep_tensors_disjoint("combine", ts, 2), MOE_EP_ERR_INVALID_ARGUMENT);
  // Adjacent is not shared.
  ts[1].t = &out_after.t;
  EXPECT_EQ(mep_tensors_disjoint("combine", ts, 2), MOE_EP_OK) << mep_last_error();
}

TEST(ValidateTest, ReadOnlyTensorsMayShareAndEmptyOrAbsentOnesAreSkipped) {
  uint16_t buf[64] = {};
  View a(buf, 0, 4), b(buf, 8, 4), out(buf, 0, 0), w(buf, 40, 2), w2(buf, 44, 2);
  mep_named_tensor_t ts[] = {{"params->x", &a.t, 0},
                             {"params->topk_weights", &b.t, 0},
                             {"params->recv_x", &out.t, 1},
                             {"params->recv_scales", nullptr, 1},
                             {"params->recv_count", &w.t, 1}};
  EXPECT_EQ(mep_tensors_disjoint("dispatch", ts, 5), MOE_EP_OK) << mep_last_error();
  // Two written tensors may not share either.
  ts[1] = {"params->recv_topk_idx", &w2.t, 1};
  ASSERT_EQ(mep_tensors_disjoint("dispatch", ts, 5), MOE_EP_ERR_INVALID_ARGUMENT);
  const std::string msg = mep_last_error();
  EXPECT_NE(msg.find("writes params->recv_topk_idx while it writes params->recv_count"),
            std::string::npos)
      << msg;
}

}  // namespace
