"""ferry's own device work on a Runtime (ferry.h "ferry's own device work"):
fill, compute and the asynchronous copy to the host, each on the device its
handle names, captured like any call on a capturing stream of device 0.

A mixin of ferry.Runtime, kept apart from __init__.py; it uses the Runtime's
_live, _check, _lib, _devices, _capturing, _capture_gate and _host_outs.
"""
import ctypes

from . import _lib


class DeviceWork:
    """Runtime.fill, Runtime.compute and Runtime.copy_to_host."""

    def _device_for(self, h, what):
        from . import _handle
        c = _handle(h, what)
        return c, (0 if self._devices == 1 else self.device_of(h))

    def fill(self, h, seed, stream=0):
        """Writes the deterministic pattern of `seed` (the replay format's `fill`)
        into the whole block, on `stream` of the device h names. StaleHandleError,
        InvalidArgumentError (bad stream). Never blocks."""
        from . import _int
        rt = self._live()
        dst, device = self._device_for(h, "fill")
        seed = _int(seed, "fill: seed", 64)
        stream = _int(stream, "fill: stream", 32)
        if device == 0:
            self._check(self._lib.ferry_fill(rt, stream, dst, seed))
        else:
            self._check(self._lib.ferry_device_fill(rt, device, stream, dst, seed))

    def compute(self, inputs, output, stream=0, flops=0, mem_bytes=0):
        """A kernel that writes into the whole of `output` a value that depends on
        every byte of every input (the replay format's `compute`), on `stream` of
        the device `output` names; flops, mem_bytes: its modeled cost on sim.
        StaleHandleError (an input or the output; another device's),
        InvalidArgumentError (bad stream). Never blocks."""
        from . import _handle, _int, _invalid
        rt = self._live()
        out, device = self._device_for(output, "compute: output")
        inputs = list(inputs)
        array = (_lib.CHandle * max(1, len(inputs)))(*[_handle(h, "compute: input") for h in inputs])
        stream = _int(stream, "compute: stream", 32)
        try:
            flops = float(flops)
        except (TypeError, ValueError):
            raise _invalid("compute: flops %r is not a number" % (flops,)) from None
        mem_bytes = _int(mem_bytes, "compute: mem_bytes", 64)
        if device == 0:
            self._check(self._lib.ferry_compute(rt, stream, array, len(inputs), out, flops, mem_bytes))
        else:
            self._check(self._lib.ferry_device_compute(rt, device, stream, array, len(inputs), out, flops,
                                                       mem_bytes))

    def copy_to_host(self, h, out, stream=0):
        """Device -> host without a host wait: the block's bytes land in the first
        bytes of `out` (a writable C-contiguous buffer: bytearray, a numpy array...,
        at least as large as the block) when the op completes; read them after
        synchronize(). ferry holds `out` (not resizable, kept alive) until then: the
        next synchronize() of its device that returns. On a capturing stream the
        copy is recorded, every replay writes `out` again, and ferry holds it until
        the graph is destroyed and a synchronize() returned after that.
        InvalidArgumentError (`out` smaller than the block, not writable or not
        contiguous; bad stream), StaleHandleError. Never blocks."""
        from . import _int, _invalid
        rt = self._live()
        src, device = self._device_for(h, "copy_to_host")
        stream = _int(stream, "copy_to_host: stream", 32)
        try:
            buf = _lib.Buffer(out, writable=True)
        except (BufferError, ValueError, TypeError) as e:
            raise _invalid("copy_to_host: out %s is not a writable contiguous buffer (%s)"
                           % (type(out).__name__, e)) from None
        try:
            with self._capture_gate.shared("copy_to_host"):
                capture = self._capturing.get(stream) if device == 0 else None
                if device == 0:
                    self._check(self._lib.ferry_copy_to_host(rt, stream, src, buf.address, buf.nbytes))
                else:
                    self._check(self._lib.ferry_device_copy_to_host(rt, device, stream, src, buf.address,
                                                                    buf.nbytes))
                if capture is not None:
                    capture[1].append(buf)  # the graph's until it is destroyed and synchronized
                else:
                    with self._retired_lock:
                        self._host_outs.append((device, buf))
        except BaseException:
            buf.release()  # refused: ferry holds nothing
            raise


def release_buffers(items):
    """Releases the _lib.Buffer holds among `items` (the rest are plain bytes)."""
    for item in items:
        if isinstance(item, _lib.Buffer):
            item.release()
