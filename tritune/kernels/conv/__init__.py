"""The conv2d family: NHWC convolution as an implicit GEMM."""
