# The harness the torch GPU scripts share (run.sh, native.sh, pytorch_tests.sh); sourced, not run.
# It must be sourced from the repository root, after `start=$(date +%s)`.

# step NAME: a header with the seconds since the script started.
step() { echo; echo "===== $1  (t=$(( $(date +%s) - start ))s)"; }

# install_wheel: installs the newest gpu-out/cudamem-*.whl (built by scripts/gpu/torch/build.sh on
# the development machine) into /tmp/site and puts it first on PYTHONPATH; a fresh shim cache per
# process, so that a build really compiles and shows its errors; no cudamem or torch allocator
# settings from the caller's environment. Returns 1 when there is no wheel or pip fails.
install_wheel() {
    local wheel
    wheel=$(ls -t gpu-out/cudamem-*.whl 2>/dev/null | head -n 1)
    if [ -z "$wheel" ]; then
        echo "no gpu-out/cudamem-*.whl: run scripts/gpu/torch/build.sh on the development machine first"
        return 1
    fi
    echo "wheel: $wheel"
    cat gpu-out/MANIFEST-torch.txt 2>/dev/null
    rm -rf /tmp/site/cudamem /tmp/site/cudamem-*.dist-info
    python3 -m pip install -q --no-index --no-deps --target /tmp/site "$wheel" || return 1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    export CUDAMEM_CACHE_DIR=/tmp/cudamem-cache-$$
    clean_env
}

# clean_env: no cudamem or torch allocator settings from the caller's environment.
clean_env() {
    unset CUDAMEM_DEVICE CUDAMEM_POLICY CUDAMEM_ALLOC_CONF PYTORCH_CUDA_ALLOC_CONF CUDAMEM_TORCH_NATIVE
}
