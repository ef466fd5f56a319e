#!/usr/bin/env bash
# System tools `make test` uses as independent peers (`make demo` needs none of them): kcat (a Kafka client that
# is not ours), kubectl (renders the kustomize overlays), promtool (Debian package prometheus: checks the alert rules, the
# scrape config and a live worker's /metrics) and Chromium with its WebDriver (the review console is
# tested in a real browser). Installed from Debian only when missing.
set -euo pipefail
missing=()
command -v kcat >/dev/null 2>&1 || missing+=(kcat)
command -v kubectl >/dev/null 2>&1 || missing+=(kubectl)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install these system packages first: ${missing[*]} (Debian: apt-get install ${missing[*]})" >&2
  exit 1
fi
echo "installing ${missing[*]} with apt"
apt-get update -qq
for pkg in "${missing[@]}"; do
  # kubectl is not in stock Debian (it comes from the Kubernetes or Cloud SDK apt repository); the
  # deploy tests then fail with a clear message instead of the whole setup failing here.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >/dev/null || echo "warning: could not install $pkg" >&2
done
