// abi_layout_test.cc: pins the size and every field offset of the public
// structs (x86-64 LP64), so nobody moves a field of ABI v1 by accident, and
// checks the tensor descriptor is layout-identical to DLPack's DLTensor.
#include <dlpack/dlpack.h>
#include <gtest/gtest.h>

#include <cstddef>

#include "moe_ep.h"

#define PIN(type, field, off) EXPECT_EQ(offsetof(type, field), static_cast<size_t>(off)) << #type "." #field

TEST(AbiLayout, TensorMatchesDLTensor) {
  EXPECT_EQ(sizeof(moe_ep_tensor_t), sizeof(DLTensor));
  EXPECT_EQ(offsetof(moe_ep_tensor_t, data), offsetof(DLTensor, data));
  EXPECT_EQ(offsetof(moe_ep_tensor_t, device), offsetof(DLTensor, device));
  EXPECT_EQ(offsetof(moe_ep_tensor_t, ndim), offsetof(DLTensor, ndim));
  EXPECT_EQ(offsetof(moe_ep_tensor_t, dtype), offsetof(DLTensor, dtype));
  EXPECT_EQ(offsetof(moe_ep_tensor_t, shape), offsetof(DLTensor, shape));
  EXPECT_EQ(offsetof(moe_ep_tensor_t, strides), offsetof(DLTensor, strides));
  EXPECT_EQ(offsetof(moe_ep_tensor_t, byte_offset), offsetof(DLTensor, byte_offset));
  EXPECT_EQ(sizeof(moe_ep_data_type_t), sizeof(DLDataType));
  EXPECT_EQ(sizeof(moe_ep_device_t), sizeof(DLDevice));
  EXPECT_EQ(MOE_EP_DTYPE_BFLOAT, kDLBfloat);
  EXPECT_EQ(MOE_EP_DTYPE_FLOAT, kDLFloat);
  EXPECT_EQ(MOE_EP_DEVICE_CUDA, kDLCUDA);
  EXPECT_EQ(MOE_EP_DEVICE_CPU, kDLCPU);
}

TEST(AbiLayout, Tensor) {
  EXPECT_EQ(sizeof(moe_ep_tensor_t), 48u);
  PIN(moe_ep_tensor_t, data, 0);
  PIN(moe_ep_tensor_t, device, 8);
  PIN(moe_ep_tensor_t, ndim, 16);
  PIN(moe_ep_tensor_t, dtype, 20);
  PIN(moe_ep_tensor_t, shape, 24);
  PIN(moe_ep_tensor_t, strides, 32);
  PIN(moe_ep_tensor_t, byte_offset, 40);
}

TEST(AbiLayout, Config) {
  EXPECT_EQ(sizeof(moe_ep_config_t), 392u);  // 384 before 0.3's ranks_per_node
  PIN(moe_ep_config_t, struct_size, 0);
  PIN(moe_ep_config_t, backend, 8);
  PIN(moe_ep_config_t, mode, 12);
  PIN(moe_ep_config_t, num_experts, 16);
  PIN(moe_ep_config_t, hidden, 20);
  PIN(moe_ep_config_t, top_k, 24);
  PIN(moe_ep_config_t, max_tokens_per_rank, 28);
  PIN(moe_ep_config_t, dispatch_dtype, 32);
  PIN(moe_ep_config_t, fp8_scale, 36);
  PIN(moe_ep_config_t, double_buffer, 40);
  PIN(moe_ep_config_t, transport, 44);
  PIN(moe_ep_config_t, bootstrap_timeout_ms, 48);
  PIN(moe_ep_config_t, kernel_timeout_ms, 52);
  PIN(moe_ep_config_t, log_level, 56);
  PIN(moe_ep_config_t, bootstrap_address, 60);
  PIN(moe_ep_config_t, bootstrap_token_env, 316);
  // Appended in 0.3, past 384: an older struct_size covers reserved0 (its
  // unwritten tail padding) but never ranks_per_node.
  PIN(moe_ep_config_t, reserved0, 380);
  PIN(moe_ep_config_t, ranks_per_node, 384);
  PIN(moe_ep_config_t, reserved1, 388);
}

TEST(AbiLayout, GroupParamsAndInfo) {
  EXPECT_EQ(sizeof(moe_ep_group_params_t), 40u);
  PIN(moe_ep_group_params_t, struct_size, 0);
  PIN(moe_ep_group_params_t, config, 8);
  PIN(moe_ep_group_params_t, rank, 16);
  PIN(moe_ep_group_params_t, world_size, 20);
  PIN(moe_ep_group_params_t, cuda_device, 24);
  PIN(moe_ep_group_params_t, nccl_comm, 32);
  EXPECT_EQ(sizeof(moe_ep_group_info_t), 64u);
  PIN(moe_ep_group_info_t, rank, 8);
  PIN(moe_ep_group_info_t, world_size, 12);
  PIN(moe_ep_group_info_t, num_local_experts, 16);
  PIN(moe_ep_group_info_t, backend, 20);
  PIN(moe_ep_group_info_t, mode, 24);
  PIN(moe_ep_group_info_t, num_sms, 28);
  PIN(moe_ep_group_info_t, bytes_allocated, 32);
  PIN(moe_ep_group_info_t, config_hash, 40);
  PIN(moe_ep_group_info_t, peer_transports, 48);
  PIN(moe_ep_group_info_t, peer_transports_len, 56);
}

TEST(AbiLayout, OperationParams) {
  EXPECT_EQ(sizeof(moe_ep_prepare_params_t), 56u);
  PIN(moe_ep_prepare_params_t, topk_idx, 8);
  PIN(moe_ep_prepare_params_t, num_tokens, 16);
  PIN(moe_ep_prepare_params_t, top_k, 20);
  PIN(moe_ep_prepare_params_t, stream, 24);
  PIN(moe_ep_prepare_params_t, num_tokens_per_rank, 32);
  PIN(moe_ep_prepare_params_t, num_tokens_per_expert, 40);
  PIN(moe_ep_prepare_params_t, is_token_in_rank, 48);
  EXPECT_EQ(sizeof(moe_ep_dispatch_params_t), 104u);
  PIN(moe_ep_dispatch_params_t, flags, 8);
  PIN(moe_ep_dispatch_params_t, hidden, 12);
  PIN(moe_ep_dispatch_params_t, x, 16);
  PIN(moe_ep_dispatch_params_t, stream, 24);
  PIN(moe_ep_dispatch_params_t, recv_x, 32);
  PIN(moe_ep_dispatch_params_t, recv_scales, 40);
  PIN(moe_ep_dispatch_params_t, recv_count, 48);
  PIN(moe_ep_dispatch_params_t, topk_weights, 56);
  PIN(moe_ep_dispatch_params_t, recv_topk_idx, 64);
  PIN(moe_ep_dispatch_params_t, recv_topk_weights, 72);
  PIN(moe_ep_dispatch_params_t, num_recv_tokens, 80);
  PIN(moe_ep_dispatch_params_t, format, 88);  // appended in 0.2
  PIN(moe_ep_dispatch_params_t, reserved0, 92);
  PIN(moe_ep_dispatch_params_t, x_scales, 96);  // appended in 0.3
  EXPECT_EQ(sizeof(moe_ep_combine_params_t), 48u);
  PIN(moe_ep_combine_params_t, flags, 8);
  PIN(moe_ep_combine_params_t, hidden, 12);
  PIN(moe_ep_combine_params_t, y, 16);
  PIN(moe_ep_combine_params_t, topk_weights, 24);
  PIN(moe_ep_combine_params_t, out, 32);
  PIN(moe_ep_combine_params_t, stream, 40);
  EXPECT_EQ(sizeof(moe_ep_handle_layout_params_t), 32u);  // 0.3
  PIN(moe_ep_handle_layout_params_t, struct_size, 0);
  PIN(moe_ep_handle_layout_params_t, src_info, 8);
  PIN(moe_ep_handle_layout_params_t, layout_range, 16);
  PIN(moe_ep_handle_layout_params_t, stream, 24);
}

// 0.3's flag takes the next bit; the older ones keep theirs.
TEST(AbiLayout, Flags) {
  EXPECT_EQ(MOE_EP_FLAG_DEFER_RECV, 1u);
  EXPECT_EQ(MOE_EP_FLAG_ROUND_SCALE, 2u);
  EXPECT_EQ(MOE_EP_FLAG_WORST_CASE, 4u);
}

// The inline initializers (usable from C++) zero the struct and set its size.
TEST(AbiLayout, InitializersFromCxx) {
  moe_ep_dispatch_params_t d = moe_ep_dispatch_params_init();
  EXPECT_EQ(d.struct_size, sizeof(d));
  EXPECT_EQ(d.flags, 0u);
  EXPECT_EQ(d.x, nullptr);
  EXPECT_EQ(moe_ep_group_params_init().struct_size, sizeof(moe_ep_group_params_t));
  EXPECT_EQ(moe_ep_group_info_init().struct_size, sizeof(moe_ep_group_info_t));
  EXPECT_EQ(moe_ep_prepare_params_init().struct_size, sizeof(moe_ep_prepare_params_t));
  EXPECT_EQ(moe_ep_combine_params_init().stream, nullptr);
  moe_ep_handle_layout_params_t l = moe_ep_handle_layout_params_init();
  EXPECT_EQ(l.struct_size, sizeof(l));
  EXPECT_EQ(l.src_info, nullptr);
  EXPECT_EQ(d.x_scales, nullptr);
}

TEST(AbiLayout, PluginTableV1) {
  EXPECT_EQ(MOE_EP_ABI_VERSION, 1u);
  EXPECT_EQ(sizeof(moe_ep_plugin_v1_t), 192u);
  PIN(moe_ep_plugin_v1_t, struct_size, 0);
  PIN(moe_ep_plugin_v1_t, abi_version, 8);
  PIN(moe_ep_plugin_v1_t, name, 16);
  PIN(moe_ep_plugin_v1_t, get_version, 24);
  PIN(moe_ep_plugin_v1_t, last_error, 32);
  PIN(moe_ep_plugin_v1_t, status_string, 40);
  PIN(moe_ep_plugin_v1_t, set_logger, 48);
  PIN(moe_ep_plugin_v1_t, config_from_yaml, 56);
  PIN(moe_ep_plugin_v1_t, config_free, 64);
  PIN(moe_ep_plugin_v1_t, buffer_size_hint, 72);
  PIN(moe_ep_plugin_v1_t, group_create, 80);
  PIN(moe_ep_plugin_v1_t, group_destroy, 88);
  PIN(moe_ep_plugin_v1_t, group_info, 96);
  PIN(moe_ep_plugin_v1_t, group_poll_error, 104);
  PIN(moe_ep_plugin_v1_t, set_num_sms, 112);
  PIN(moe_ep_plugin_v1_t, max_sms_used, 120);
  PIN(moe_ep_plugin_v1_t, prepare, 128);
  PIN(moe_ep_plugin_v1_t, dispatch, 136);
  PIN(moe_ep_plugin_v1_t, combine, 144);
  PIN(moe_ep_plugin_v1_t, hook_run, 152);
  PIN(moe_ep_plugin_v1_t, hook_free, 160);
  PIN(moe_ep_plugin_v1_t, handle_free, 168);
  PIN(moe_ep_plugin_v1_t, handle_layout, 176);  // appended in 0.3
  PIN(moe_ep_plugin_v1_t, group_busy_hook, 184);  // appended in 0.4
}
