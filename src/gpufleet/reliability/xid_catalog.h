// SPDX-License-Identifier: Apache-2.0
#pragma once

// What an NVIDIA XID says about the GPU that reported it, after the XID catalog's "resolution
// bucket" for Ampere and later and the drain summary in docs/reliability.md.
namespace gpufleet::reliability {

enum class XidAction {
  kApplication,    // the job's own fault (13, 31, 43, 45, 68, ...): says nothing about the GPU
  kMonitor,        // correctable or informational (92, 121, ...): watch, do not drain
  kDrainAfterJob,  // take the GPU out once its job ends, then reset (63, 94, 109)
  kDrainNow,       // take the GPU out at once (46, 48, 74, 79, 95, 119, ...)
};

const char* XidActionName(XidAction action);  // "application", "monitor", ...

// The action for `xid`. An XID the catalog does not list is treated as a hardware fault of the
// GPU (kDrainAfterJob), as the Kubernetes device plugin and Meta's GCM treat unknown XIDs.
XidAction ClassifyXid(int xid);

// True when the XID blames the GPU that reported it: kDrainAfterJob or kDrainNow.
inline bool XidBlamesGpu(int xid) {
  const XidAction action = ClassifyXid(xid);
  return action == XidAction::kDrainAfterJob || action == XidAction::kDrainNow;
}

}  // namespace gpufleet::reliability
