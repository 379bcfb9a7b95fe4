#!/usr/bin/with-contenv bashio
# shellcheck shell=bash
# ==============================================================================
# Pi Voice add-on: reads the options, starts the Wyoming server (and, if enabled,
# the satellite), and announces the server to Home Assistant through the
# Supervisor, the way the official Wyoming add-ons do.
# ==============================================================================
set -euo pipefail

readonly SERVER_PORT=10800
# Where the Supervisor writes the options (the tests point elsewhere).
readonly OPTIONS="${PIVOICE_ADDON_OPTIONS:-/data/options.json}"

# Models given by name are downloaded once and kept with the add-on's data
# (/data/huggingface, which backups leave out).
export HF_HOME=/data/huggingface
export PIVOICE_DATA_DIR=/data

server_args=()
satellite_args=()
pids=()
discovery_pid=""

# The service's command line from the options, made by the package from the flags its
# settings carry (wyoming_pivoice/addon.py): a new option needs no line here. NUL-separated,
# so a system prompt keeps every character.
read_args() {
    local service="$2" file
    file=$(mktemp)
    if ! wyoming-pivoice addon-args "${service}" --options "${OPTIONS}" > "${file}"; then
        rm -f "${file}"
        bashio::log.error "The ${service}'s options could not be read"
        exit 2
    fi
    mapfile -d '' -t "$1" < "${file}"
    rm -f "${file}"
}

build_server_args() {
    read_args server_args server
    # The key goes by environment, so it is neither in the process list nor in the
    # "Starting" log line.
    if bashio::config.has_value 'llm_api_key'; then
        PIVOICE_LLM_API_KEY="$(bashio::config 'llm_api_key')"
        export PIVOICE_LLM_API_KEY
    fi
}

build_satellite_args() {
    read_args satellite_args satellite
}

# True once a Wyoming server on HOST PORT answers `describe` with `info`.
answers_describe() {
    local reply=""
    { exec 3<>"/dev/tcp/$1/$2"; } 2>/dev/null || return 1
    printf '{"type": "describe"}\n' >&3
    IFS= read -r -t 5 reply <&3 || true
    exec 3>&-
    [[ "${reply}" =~ \"type\":\ *\"info\" ]]
}

# Tells Home Assistant where the server is, once it answers (Supervisor discovery).
announce_server() {
    local server_pid="$1"
    until answers_describe 127.0.0.1 "${SERVER_PORT}"; do
        kill -0 "${server_pid}" 2>/dev/null || return 0
        sleep 0.5
    done
    local config
    config=$(bashio::var.json uri "tcp://$(hostname):${SERVER_PORT}")
    if bashio::discovery "wyoming" "${config}" > /dev/null; then
        bashio::log.info "Announced the server to Home Assistant: ${config}"
    else
        bashio::log.error "Discovery message to Home Assistant failed"
    fi
}

stop_all() {
    trap - TERM INT
    kill "${pids[@]}" ${discovery_pid:+"${discovery_pid}"} 2>/dev/null || true
    wait || true
    exit "$1"
}

main() {
    trap 'stop_all 0' TERM INT
    build_server_args
    bashio::log.info "Starting: wyoming-pivoice ${server_args[*]}"
    wyoming-pivoice "${server_args[@]}" &
    pids+=("$!")

    if bashio::config.true 'satellite_enabled'; then
        build_satellite_args
        bashio::log.info "Starting: wyoming-pivoice ${satellite_args[*]}"
        wyoming-pivoice "${satellite_args[@]}" &
        pids+=("$!")
    fi

    announce_server "${pids[0]}" &
    discovery_pid=$!

    # When either service ends the add-on stops, so the Supervisor's watchdog restarts it whole.
    local status=0
    wait -n "${pids[@]}" || status=$?
    bashio::log.warning "A service exited with status ${status}; stopping the add-on"
    stop_all "${status}"
}

main "$@"
