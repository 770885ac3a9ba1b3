"""A training loop the harness does not own (Keras's fit, Lightning's
Trainer.fit), driven one batch at a time by the harness's own loop.

The high-level API's loop runs in a thread of its own. A callback of that
API calls hand_over(loss) as each batch ends: the harness's step() returns
that loss, and the API's thread waits there until the harness asks for the
next batch (step() again) or for the end (stop()). So the harness's warm-up,
timed blocks, accuracy epochs and faults drive the API's loop as they drive
a custom step, and what the harness does between steps (the learning rate,
the evaluation, the gathers) runs while the API's loop waits. Only one of
the two threads runs at a time.
"""

from __future__ import annotations

import queue
import threading

from trainscale.harness.epochs import steps_per_epoch

# The batches an API's loop is given outside accuracy mode: as many as the
# harness asks for (its blocks, or a bench's), which then ends the loop.
UNBOUNDED = 2**31 - 1


def api_epochs(backend) -> tuple[int, int]:
    """(epochs, batches per epoch) an API's loop is given: the harness's
    epochs in accuracy mode, else one epoch of UNBOUNDED batches."""
    s = backend.settings
    if s.mode == "accuracy":
        return s.epochs, steps_per_epoch(backend)
    return 1, UNBOUNDED


class DrivenLoop:
    def __init__(self, run, name: str):
        """`run()` runs the API's loop to its end; its callback calls hand_over."""
        self.run, self.name = run, name
        self.next_batch: queue.Queue = queue.Queue()
        self.finished: queue.Queue = queue.Queue()
        self.thread: threading.Thread | None = None

    def hand_over(self, loss) -> bool:
        """At a batch's end, in the API's thread: give the loss to the
        harness, wait for its answer; False: end the loop now."""
        self.finished.put(loss)
        return self.next_batch.get()

    def _run(self) -> None:
        try:
            self.run()
            self.finished.put(StopIteration(f"{self.name} ended before the loop's last step"))
        except BaseException as err:  # step() raises it again (an OOM, a lost peer)
            self.finished.put(err)

    def step(self):
        """Run the next batch; its loss as the API's callback handed it over."""
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self.thread.start()
        else:
            self.next_batch.put(True)
        result = self.finished.get()
        if isinstance(result, BaseException):
            raise result
        return result

    def stop(self) -> None:
        """End the API's loop after its last batch (its own end-of-loop work runs)."""
        if self.thread is not None and self.thread.is_alive():
            self.next_batch.put(False)
            self.thread.join()
