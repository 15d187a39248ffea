#pragma once
/// \file
/// Portability macros shared by host and CUDA code. Element-level code is
/// `constexpr DCR_HOST_DEVICE`, allocation-free and exception-free so that the
/// same function serves a kernel and its host twin.

#if defined(__CUDACC__)
#define DCR_HOST_DEVICE __host__ __device__
#define DCR_DEVICE __device__
#else
#define DCR_HOST_DEVICE
#define DCR_DEVICE
#endif

#if defined(__GNUC__) || defined(__clang__)
#define DCR_LIKELY(x) __builtin_expect(!!(x), 1)
#define DCR_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define DCR_UNREACHABLE() __builtin_unreachable()
#define DCR_RESTRICT __restrict__
#else
#define DCR_LIKELY(x) (x)
#define DCR_UNLIKELY(x) (x)
#define DCR_UNREACHABLE() ((void)0)
#define DCR_RESTRICT
#endif
