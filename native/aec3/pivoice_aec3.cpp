// WebRTC's AEC3 (webrtc-audio-processing 1.3, as bundled in rhasspy's webrtc-noise-gain
// sdist) with its *linear* filter's output exported: the microphone less the adaptive
// filter's echo estimate, before AEC3's residual-echo suppressor. The satellite weighs it
// for barge-in (a voice that starts over a loud reply passes it at its own level, where
// the suppressor takes it apart for 300-500 ms; docs/room.md sessions 13-15).
//
// One APM, 16 kHz mono, 10 ms frames: AEC3 on, noise suppression and gain control off,
// the high-pass filter as asked (livekit's APM: on). Unlike livekit's APM it takes AEC3's
// config by field (`config`, CONFIG_FIELDS): the suppressor's nearend detection and tunings.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include "api/audio/echo_canceller3_config.h"
#include "api/audio/echo_control.h"
#include "api/scoped_refptr.h"
#include "modules/audio_processing/aec3/echo_canceller3.h"
#include "modules/audio_processing/include/audio_processing.h"

namespace py = pybind11;

namespace {

constexpr int kRate = 16000;
constexpr int kFrame = kRate / 100;

using Config = webrtc::EchoCanceller3Config;
using Setter = std::function<void(Config&, py::handle)>;

// The EchoCanceller3Config fields a caller may set, by their dotted path in the struct
// (api/audio/echo_canceller3_config.h): the residual-echo suppressor's nearend detection and
// tunings, which livekit's APM does not expose (a voice that starts over a loud reply is
// taken apart by it for 300-500 ms; docs/room.md sessions 13-15).
#define PIVOICE_FIELD(path, type) \
  {#path, [](Config& c, py::handle v) { c.path = py::cast<type>(v); }}
#define PIVOICE_MASK(tuning, band)                                     \
  PIVOICE_FIELD(suppressor.tuning.band.enr_transparent, float),        \
      PIVOICE_FIELD(suppressor.tuning.band.enr_suppress, float),       \
      PIVOICE_FIELD(suppressor.tuning.band.emr_transparent, float)
#define PIVOICE_TUNING(tuning)                                          \
  PIVOICE_MASK(tuning, mask_lf), PIVOICE_MASK(tuning, mask_hf),         \
      PIVOICE_FIELD(suppressor.tuning.max_inc_factor, float),           \
      PIVOICE_FIELD(suppressor.tuning.max_dec_factor_lf, float)

const std::map<std::string, Setter>& fields() {
  static const std::map<std::string, Setter> table = {
      PIVOICE_FIELD(suppressor.dominant_nearend_detection.enr_threshold, float),
      PIVOICE_FIELD(suppressor.dominant_nearend_detection.enr_exit_threshold, float),
      PIVOICE_FIELD(suppressor.dominant_nearend_detection.snr_threshold, float),
      PIVOICE_FIELD(suppressor.dominant_nearend_detection.hold_duration, int),
      PIVOICE_FIELD(suppressor.dominant_nearend_detection.trigger_threshold, int),
      PIVOICE_FIELD(suppressor.dominant_nearend_detection.use_during_initial_phase, bool),
      PIVOICE_FIELD(suppressor.use_subband_nearend_detection, bool),
      PIVOICE_FIELD(suppressor.nearend_average_blocks, size_t),
      PIVOICE_FIELD(suppressor.floor_first_increase, float),
      PIVOICE_TUNING(normal_tuning),
      PIVOICE_TUNING(nearend_tuning),
      PIVOICE_FIELD(erle.min, float),
      PIVOICE_FIELD(erle.max_l, float),
      PIVOICE_FIELD(erle.max_h, float),
      PIVOICE_FIELD(ep_strength.default_gain, float),
      PIVOICE_FIELD(ep_strength.default_len, float),
      PIVOICE_FIELD(ep_strength.echo_can_saturate, bool),
      PIVOICE_FIELD(ep_strength.bounded_erl, bool),
      PIVOICE_FIELD(filter.refined.length_blocks, size_t),
      PIVOICE_FIELD(filter.coarse.length_blocks, size_t),
      PIVOICE_FIELD(filter.export_linear_aec_output, bool),
  };
  return table;
}

#undef PIVOICE_TUNING
#undef PIVOICE_MASK
#undef PIVOICE_FIELD

// The config with the caller's fields set; ValueError on an unknown field or one that
// EchoCanceller3Config::Validate has to clamp (AEC3 would run on other values than asked).
Config make_config(bool linear, size_t filter_blocks, const py::dict& settings) {
  Config config;
  config.filter.export_linear_aec_output = linear;
  // The linear filters' length in 4 ms blocks after the estimated delay (AEC3's default 13:
  // 52 ms; a room's reverberant tail beyond it is left to the suppressor).
  if (filter_blocks > 0) {
    config.filter.refined.length_blocks = filter_blocks;
    config.filter.coarse.length_blocks = filter_blocks;
  }
  for (auto item : settings) {
    const std::string key = py::cast<std::string>(item.first);
    auto field = fields().find(key);
    if (field == fields().end()) throw py::value_error("unknown AEC3 config field: " + key);
    field->second(config, item.second);
  }
  if (!Config::Validate(&config)) {
    throw py::value_error("AEC3 config out of its valid ranges (Validate clamped it)");
  }
  return config;
}

// APM builds AEC3 from a default EchoCanceller3Config unless given a factory, and the
// default does not export the linear output (APM's own flag only allocates the buffer).
class Aec3Factory : public webrtc::EchoControlFactory {
 public:
  explicit Aec3Factory(const Config& config) : config_(config) {}
  std::unique_ptr<webrtc::EchoControl> Create(int sample_rate_hz, int num_render_channels,
                                              int num_capture_channels) override {
    return std::make_unique<webrtc::EchoCanceller3>(config_, sample_rate_hz,
                                                    num_render_channels,
                                                    num_capture_channels);
  }

 private:
  Config config_;
};

using Pcm = py::array_t<int16_t, py::array::c_style | py::array::forcecast>;

const int16_t* frame_of(const Pcm& pcm, const char* what) {
  if (pcm.ndim() != 1 || pcm.shape(0) != kFrame) {
    throw std::invalid_argument(std::string(what) + ": one 10 ms frame (160 int16 samples)");
  }
  return pcm.data();
}

class Aec3 {
 public:
  Aec3(bool high_pass_filter, bool linear_output, size_t filter_blocks, const py::dict& settings)
      : linear_(linear_output), stream_(kRate, 1) {
    webrtc::AudioProcessingBuilder builder;
    builder.SetEchoControlFactory(
        std::make_unique<Aec3Factory>(make_config(linear_output, filter_blocks, settings)));
    apm_ = rtc::scoped_refptr<webrtc::AudioProcessing>(builder.Create());
    if (!apm_) throw std::runtime_error("AudioProcessing could not be created");
    webrtc::AudioProcessing::Config config;
    config.echo_canceller.enabled = true;
    config.echo_canceller.mobile_mode = false;
    config.echo_canceller.export_linear_aec_output = linear_output;
    config.high_pass_filter.enabled = high_pass_filter;
    config.noise_suppression.enabled = false;
    config.gain_controller1.enabled = false;
    config.gain_controller2.enabled = false;
    config.voice_detection.enabled = false;
    apm_->ApplyConfig(config);
    apm_->Initialize();
  }

  void process_reverse(const Pcm& far) {
    const int16_t* src = frame_of(far, "process_reverse");
    std::array<int16_t, kFrame> scratch;
    int err;
    {
      py::gil_scoped_release release;
      err = apm_->ProcessReverseStream(src, stream_, stream_, scratch.data());
    }
    if (err != 0) throw std::runtime_error("ProcessReverseStream failed: " + std::to_string(err));
  }

  // The echo-cancelled frame and (linear_output) AEC3's linear filter's output for it.
  py::tuple process(const Pcm& near) {
    const int16_t* src = frame_of(near, "process");
    Pcm out(kFrame);
    int16_t* dest = out.mutable_data();
    std::array<std::array<float, kFrame>, 1> linear;
    int err;
    bool got = false;
    {
      py::gil_scoped_release release;
      err = apm_->ProcessStream(src, stream_, stream_, dest);
      if (err == 0 && linear_) got = apm_->GetLinearAecOutput(linear);
    }
    if (err != 0) throw std::runtime_error("ProcessStream failed: " + std::to_string(err));
    if (!got) return py::make_tuple(out, py::none());
    Pcm lin(kFrame);
    int16_t* l = lin.mutable_data();
    for (int i = 0; i < kFrame; ++i) {  // AEC3 works on floats at int16 scale
      l[i] = static_cast<int16_t>(std::lround(std::clamp(linear[0][i], -32768.0f, 32767.0f)));
    }
    return py::make_tuple(out, lin);
  }

  void set_stream_delay_ms(int delay) { apm_->set_stream_delay_ms(delay); }

  // AEC3's own estimates (None until it has them): ERL, ERLE (dB), delay (ms).
  py::dict statistics() {
    webrtc::AudioProcessingStats stats = apm_->GetStatistics();
    py::dict d;
    d["erl_db"] = stats.echo_return_loss ? py::cast(*stats.echo_return_loss) : py::none();
    d["erle_db"] = stats.echo_return_loss_enhancement
                       ? py::cast(*stats.echo_return_loss_enhancement)
                       : py::none();
    d["delay_ms"] = stats.delay_ms ? py::cast(*stats.delay_ms) : py::none();
    return d;
  }

 private:
  bool linear_;
  webrtc::StreamConfig stream_;
  rtc::scoped_refptr<webrtc::AudioProcessing> apm_;
};

}  // namespace

PYBIND11_MODULE(pivoice_aec3, m) {
  m.doc() = "WebRTC AEC3 (webrtc-audio-processing 1.3): its config, its linear filter's output";
  m.attr("RATE") = kRate;
  m.attr("FRAME") = kFrame;
  // The EchoCanceller3Config fields `config` may set (dotted paths).
  py::list names;
  for (const auto& field : fields()) names.append(field.first);
  m.attr("CONFIG_FIELDS") = names;
  py::class_<Aec3>(m, "Aec3")
      .def(py::init<bool, bool, size_t, const py::dict&>(), py::arg("high_pass_filter") = true,
           py::arg("linear_output") = true, py::arg("filter_blocks") = 0,
           py::arg("config") = py::dict())
      .def("process_reverse", &Aec3::process_reverse, py::arg("far"))
      .def("process", &Aec3::process, py::arg("near"))
      .def("set_stream_delay_ms", &Aec3::set_stream_delay_ms, py::arg("delay_ms"))
      .def("statistics", &Aec3::statistics);
}
