// keel.hpp — header-only C++ helpers for plugin authors, on top of the C ABI in keel.h.
//
// A plugin written with these helpers implements plain C++ classes; the helpers produce the
// C vtables, turn every exception into a keel_status with its message, and give typed access
// to the host (config, mesh, collectives, metrics). Nothing here is part of the ABI: a plugin
// may ignore this header and implement keel.h directly. The parts, by concern:
//   keel/host.hpp        handles, errors, guard(), Config, WorkHandle and the Host wrapper
//   keel/config_keys.hpp Key and ConfigKey: the config keys a component declares
//   keel/param_view.hpp  ParamView, the accessor of a parameter record
//   keel/part.hpp        parameter declaration and the Part base class of a model part
//   keel/export.hpp      ExportSink and helpers shared by export formats
//   keel/plugin.hpp      model_component, clipper_component and KEEL_PLUGIN
//   keel/fields.hpp      a model's sizes as data: field rows and flavor rows
//   keel/replica.hpp     StageReplicas: a parameter held on the first and the last stage
// keel/init.hpp (init rules) comes with part.hpp; keel/autograd.hpp (differentiable
// collectives) is included on its own, as it pulls in LibTorch's autograd headers.
#pragma once

#include <keel/keel.h>
#include <keel/config_keys.hpp>
#include <keel/export.hpp>
#include <keel/fields.hpp>
#include <keel/host.hpp>
#include <keel/param_view.hpp>
#include <keel/part.hpp>
#include <keel/plugin.hpp>
#include <keel/replica.hpp>
