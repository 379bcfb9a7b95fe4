#!/usr/bin/with-contenv bashio
# shellcheck shell=bash
# ==============================================================================
# Pi Voice add-on: reads the options, starts the Wyoming server (and, if enabled,
# the satellite), and announces the server to Home Assistant through the
# Supervisor, the way the official Wyoming add-ons do.
# ==============================================================================
set -euo pipefail

readonly SERVER_PORT=10800
readonly SATELLITE_PORT=10700
# Your own models and voices live in the share folder.
readonly SHARE_DIR=/share/pivoice
readonly PIPER_DIR=/share/piper

# Models given by name are downloaded once and kept with the add-on's data
# (/data/huggingface, which backups leave out).
export HF_HOME=/data/huggingface
export PIVOICE_DATA_DIR=/data

server_args=()
satellite_args=()
pids=()
discovery_pid=""

# An LLM given by file name is looked up in the share folder; a catalogue name or a
# Hugging Face owner/repo:file is downloaded by the server.
llm_model_path() {
    local model="$1"
    if [[ "${model}" == embedded || "${model}" == /* || "${model}" != *.gguf || "${model}" == *:* ]]; then
        printf '%s' "${model}"
    else
        printf '%s/%s' "${SHARE_DIR}" "${model}"
    fi
}

# The model from the catalogue list if one is chosen, else the free-form option.
chosen() {
    local listed="$1" free="$2"
    if bashio::config.has_value "${listed}"; then
        bashio::config "${listed}"
    else
        bashio::config "${free}"
    fi
}

# Adds "FLAG value" when the option has a value; optional options may be absent.
add_optional() {
    local -n into="$1"
    local flag="$2" key="$3"
    if bashio::config.has_value "${key}"; then
        into+=("${flag}" "$(bashio::config "${key}")")
    fi
}

build_server_args() {
    server_args=(
        --log-level "$(bashio::config 'log_level' | tr '[:lower:]' '[:upper:]')"
        server
        --uri "tcp://0.0.0.0:${SERVER_PORT}"
        # The Supervisor announces the add-on; mDNS too would offer it twice.
        --no-zeroconf
        --asr-model "$(chosen asr_catalogue asr_model)"
        --asr-language "$(bashio::config 'asr_language')"
        --asr-beam-size "$(bashio::config 'asr_beam_size')"
    )
    add_optional server_args --asr-threads asr_threads
    add_optional server_args --asr-window asr_window
    server_args+=(
        --voice "$(chosen voice_catalogue voice)"
        --voice-dir "${SHARE_DIR}"
        --voice-dir "${PIPER_DIR}"
    )
    add_optional server_args --tts-speaker tts_speaker
    add_optional server_args --tts-length-scale tts_length_scale
    server_args+=(
        --llm-model "$(llm_model_path "$(chosen llm_catalogue llm_model)")"
        --llm-context "$(bashio::config 'llm_context')"
    )
    add_optional server_args --llm-threads llm_threads
    if bashio::config.true 'model_fallback'; then
        server_args+=(--model-fallback embedded)
    fi
    server_args+=(
        --max-tokens "$(bashio::config 'max_tokens')"
        --system-prompt "$(bashio::config 'system_prompt')"
    )
    if bashio::config.true 'llm_lazy'; then
        server_args+=(--llm-lazy)
    fi
    # The conversation on a bigger machine's OpenAI-compatible engine; the key goes by
    # environment, so it is neither in the process list nor in the "Starting" log line.
    add_optional server_args --llm-url llm_url
    add_optional server_args --llm-remote-model llm_remote_model
    add_optional server_args --llm-fallback llm_fallback
    if bashio::config.has_value 'llm_api_key'; then
        PIVOICE_LLM_API_KEY="$(bashio::config 'llm_api_key')"
        export PIVOICE_LLM_API_KEY
    fi
    # The household's notes in the share folder; their index with the add-on's data.
    if bashio::config.true 'knowledge'; then
        server_args+=(--knowledge "${SHARE_DIR}/knowledge" --knowledge-index /data/knowledge.sqlite3)
    fi
}

build_satellite_args() {
    satellite_args=(
        --log-level "$(bashio::config 'log_level' | tr '[:lower:]' '[:upper:]')"
        satellite
    )
    if [[ "$(bashio::config 'satellite_mode')" == standalone ]]; then
        # The local loop: talks to this add-on's server directly, not through Home Assistant.
        satellite_args+=(
            --server "tcp://127.0.0.1:${SERVER_PORT}"
            --language "$(bashio::config 'asr_language')"
        )
    else
        satellite_args+=(--uri "tcp://0.0.0.0:${SATELLITE_PORT}" --no-zeroconf)
        add_optional satellite_args --name satellite_name
        add_optional satellite_args --area satellite_area
    fi
    add_optional satellite_args --wake-word wake_word
    satellite_args+=(
        --vad-threshold "$(bashio::config 'vad_threshold')"
        --vad-silence-ms "$(bashio::config 'vad_silence_ms')"
    )
    # The Supervisor's PulseAudio, through ALSA's default device, unless told otherwise.
    if bashio::config.has_value 'mic_command'; then
        satellite_args+=(--mic-command "$(bashio::config 'mic_command')")
    elif bashio::config.has_value 'mic_device'; then
        satellite_args+=(--mic-device "$(bashio::config 'mic_device')")
    else
        satellite_args+=(--mic-command 'arecord -r 16000 -c 1 -f S16_LE -t raw')
    fi
    if bashio::config.has_value 'snd_command'; then
        satellite_args+=(--snd-command "$(bashio::config 'snd_command')")
    elif bashio::config.has_value 'snd_device'; then
        satellite_args+=(--snd-device "$(bashio::config 'snd_device')")
    else
        satellite_args+=(--snd-command 'aplay -r {rate} -c {channels} -f S16_LE -t raw')
    fi
    if bashio::config.true 'timing_log'; then
        satellite_args+=(--timing-log "${SHARE_DIR}/timing.jsonl")
    fi
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
