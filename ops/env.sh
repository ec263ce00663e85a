# Sourced by the ops scripts: build prerequisites and a shared target dir.
#
# The bundled RocksDB takes ~15-20 minutes to compile on two cores, so the
# Cargo target dir lives outside the clone and is reused across clones and
# runs (override with CARGO_TARGET_DIR).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tailflight/target}"
mkdir -p "$CARGO_TARGET_DIR"

# librocksdb-sys generates its bindings with bindgen, which needs libclang.
tailflight_install_build_deps() {
    if command -v clang >/dev/null 2>&1 && compgen -G "/usr/lib/llvm-*/lib/libclang*.so*" >/dev/null; then
        return 0
    fi
    echo "installing clang and libclang-dev (needed to build RocksDB bindings)" >&2
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq clang libclang-dev >/dev/null
}
