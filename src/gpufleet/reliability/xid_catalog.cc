// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/reliability/xid_catalog.h"

namespace gpufleet::reliability {

const char* XidActionName(XidAction action) {
  switch (action) {
    case XidAction::kApplication:
      return "application";
    case XidAction::kMonitor:
      return "monitor";
    case XidAction::kDrainAfterJob:
      return "drain-after-job";
    case XidAction::kDrainNow:
      return "drain-now";
  }
  return "unknown";
}

XidAction ClassifyXid(int xid) {
  switch (xid) {
    // Faults of the application (or secondary reports of one): attribute to the job. 8 and 32
    // count toward the GPU only when they repeat across jobs, which the attribution engine's
    // failure statistics already capture.
    case 8:
    case 13:
    case 31:
    case 32:
    case 43:
    case 45:
    case 68:
      return XidAction::kApplication;
    // Corrected or informational: monitor. 154 announces a recovery action that a linked XID
    // carries.
    case 61:
    case 92:
    case 121:
    case 154:
      return XidAction::kMonitor;
    // Let the running job finish, then reset.
    case 63:
    case 94:
    case 109:
      return XidAction::kDrainAfterJob;
    case 46:
    case 48:
    case 62:
    case 64:
    case 74:
    case 79:
    case 95:
    case 110:
    case 119:
    case 120:
    case 136:
    case 140:
    case 143:
    case 155:
    case 156:
    case 158:
    case 160:
      return XidAction::kDrainNow;
    default:
      break;
  }
  if (xid >= 144 && xid <= 150) {  // NVLink5 errors on NVL72-class systems
    return XidAction::kDrainNow;
  }
  return XidAction::kDrainAfterJob;
}

}  // namespace gpufleet::reliability
