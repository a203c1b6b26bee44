# Sourced by tests/cluster/build.sh and tests/pods/build.sh: building pinned Go tools into a cache folder.
# The caller sets `gomods` (the folder of the Go modules) and `bin_dir` (where the binaries go).

# The version a go.mod pins for a module; read from the file, not `go list`, to keep the fast path fast.
pinned() {  # module folder, module path
    awk -v mod="$2" '$1 == mod && $2 ~ /^v/ { print $2; exit }' "$gomods/$1/go.mod"
}

# Checks for Go, makes bin_dir and holds its lock until the caller exits: two builds at once (say `make
# test` in two shells) would only slow each other down on two cores.
start_building() {
    command -v go >/dev/null || { echo "build.sh: needs Go (1.26 or newer) on PATH" >&2; exit 1; }
    mkdir -p "$bin_dir"
    exec 9>"$bin_dir/.build.lock"
    flock 9
}

# `go build` writes into a temporary name that is renamed at the end, so an interrupted build never
# leaves a binary behind that the next run would take as done.
go_build() {  # tool, module folder (under gomods, or absolute), version, package, ldflags
    local tool="$1" module="$2" version="$3" package="$4" ldflags="$5"
    [[ "$module" == /* ]] || module="$gomods/$module"
    [[ -x "$bin_dir/$tool" ]] && return 0
    local start=$SECONDS
    echo "building $tool $version ..."
    (
        cd "$module"
        # nice: the machine has two cores and other work (tests, editors) must keep going.
        CGO_ENABLED=0 GOFLAGS=-trimpath nice -n 10 \
            go build -p 2 -ldflags "-s -w $ldflags" -o "$bin_dir/.$tool.partial" "$package"
    )
    mv "$bin_dir/.$tool.partial" "$bin_dir/$tool"
    echo "building $tool $version ... done in $((SECONDS - start))s"
}

# Release builds stamp their version in with -X; without it the servers report v0.0.0-master and
# kubectl warns about the version skew.
k8s_ldflags() {  # kubernetes version
    local minor="${1#v1.}" flags="" pkg
    minor="${minor%%.*}"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        flags+=" -X $pkg.gitVersion=$1 -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
    done
    echo "$flags"
}
