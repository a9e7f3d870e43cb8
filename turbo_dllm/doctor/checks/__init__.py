"""Check modules; each registers its checks with `turbo_dllm.doctor.register_check`."""
