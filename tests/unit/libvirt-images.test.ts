import { describe, expect, it } from "vitest";
import { refuseReferences } from "../../agent/runtimes/libvirt-kvm/images.ts";
import { RuntimeError } from "../../agent/runtimes/runtime.ts";

// What `qemu-img info --output=json` says of images (trimmed to the fields that matter).
const plain = { format: "qcow2", "virtual-size": 2 ** 30, "format-specific": { type: "qcow2", data: {} } };

describe("image references", () => {
  it("accepts an image that stands alone", () => {
    expect(() => refuseReferences(plain, "image x")).not.toThrow();
    expect(() => refuseReferences({ format: "raw", "virtual-size": 1 }, "image x")).not.toThrow();
  });
  it("refuses a backing file or an external data file, as the image's fault (not retryable), naming the file only in the host's log", () => {
    const backed = { ...plain, "backing-filename": "/etc/shadow" };
    const dataFile = { ...plain, "format-specific": { type: "qcow2", data: { "data-file": "/dev/sda" } } };
    for (const [info, reason, file] of [
      [backed, "image x names a backing file; refused", "/etc/shadow"],
      [dataFile, "image x names an external data file; refused", "/dev/sda"],
    ] as const) {
      const err = (() => {
        try {
          refuseReferences(info, "image x");
        } catch (e) {
          return e;
        }
      })();
      expect(err).toBeInstanceOf(RuntimeError);
      expect((err as RuntimeError).retryable).toBe(false);
      expect((err as Error).message).toBe(reason);
      expect(String(err)).toContain(file);
    }
  });
});
