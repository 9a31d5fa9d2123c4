# Shared by the scripts: Go on PATH, repository root as cwd.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH=/usr/local/go/bin:$PATH
command -v go >/dev/null || { echo "Go is required (https://go.dev/dl); expected at /usr/local/go/bin" >&2; exit 1; }

# apt_need installs Debian packages whose commands are missing.
apt_need() {
  local missing=()
  while [ $# -gt 0 ]; do
    command -v "$1" >/dev/null || missing+=("$2")
    shift 2
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing ${missing[*]}: install them (apt-get install ${missing[*]}) or run as root" >&2
    exit 1
  fi
  echo "installing ${missing[*]} with apt-get" >&2
  apt_get update -qq
  apt_get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# apt_get runs apt-get, waiting (up to 10 min) for a lock another apt or
# dpkg holds instead of failing at once: a new machine may be installing
# something else when the suite starts.
apt_get() {
  local out status i
  for i in $(seq 60); do
    status=0
    out=$(DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 "$@" 2>&1) || status=$?
    if [ "$status" -ne 0 ] && grep -q "Could not get lock" <<<"$out"; then
      echo "apt-get: another apt holds its lock; waiting (${i}0 s)" >&2
      sleep 10
      continue
    fi
    printf '%s\n' "$out"
    return "$status"
  done
  echo "apt-get: the apt lock stayed held for 10 minutes" >&2
  return 1
}

# debian_mirror is the first Debian archive URI apt itself uses (no
# hard-coded host), for debootstrap.
debian_mirror() {
  local m
  m=$(grep -h -E '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null |
    grep -v -- '-security' | head -n1 | awk '{ if ($1 == "deb") { for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) { print $i; exit } } else print $2 }')
  [ -n "$m" ] || { echo "no Debian mirror found in apt's sources" >&2; exit 1; }
  echo "$m"
}
