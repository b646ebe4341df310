// keel.hpp — header-only C++ helpers for plugin authors, on top of the C ABI in keel.h.
//
// A plugin written with these helpers implements plain C++ classes; the helpers produce the
// C vtables, turn every exception into a keel_status with its message, and give typed access
// to the host (config, mesh, collectives, metrics). Nothing here is part of the ABI: a plugin
// may ignore this header and implement keel.h directly.
#pragma once

#include <keel/export.hpp>
#include <keel/host.hpp>
#include <keel/keel.h>
#include <keel/part.hpp>
#include <keel/plugin.hpp>
