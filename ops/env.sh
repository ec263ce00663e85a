# Sourced by the ops scripts: build prerequisites and a shared target dir.
#
# The bundled RocksDB takes ~15-20 minutes to compile on two cores, so the
# Cargo target dir lives outside the clone and is reused across clones and
# runs (override with CARGO_TARGET_DIR).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tailflight/target}"
mkdir -p "$CARGO_TARGET_DIR"

# librocksdb-sys generates its bindings with bindgen, which needs libclang;
# rdkafka-sys builds the bundled librdkafka with cmake, against the system's
# libcurl and OpenSSL headers (found through pkg-config); etcd-client
# compiles etcd's protobufs with protoc.
tailflight_install_build_deps() {
    local missing=()
    if ! command -v clang >/dev/null 2>&1 || ! compgen -G "/usr/lib/llvm-*/lib/libclang*.so*" >/dev/null; then
        missing+=(clang libclang-dev)
    fi
    command -v cmake >/dev/null 2>&1 || missing+=(cmake)
    command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
    command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
    [ -e /usr/include/x86_64-linux-gnu/curl/curl.h ] || [ -e /usr/include/curl/curl.h ] || missing+=(libcurl4-openssl-dev)
    [ -e /usr/include/openssl/ssl.h ] || missing+=(libssl-dev)
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "installing ${missing[*]} (needed to build RocksDB's bindings, librdkafka and etcd's client)" >&2
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}
