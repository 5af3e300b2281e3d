"""The output head's product, laid out for the number of rows it scores.

The output head is the largest matrix of a small model (Gemma 3 270M: 262144 x 640, Whisper
base: 51865 x 512), and speculative decoding calls it on a handful of rows: one per draft step,
k + 1 per verification. On CPU the BLAS kernel picked for such skinny products depends on the
operands' layout, and no single layout is fast for every row count. Measured on this project's
2-core AVX-512 CPU, one thread, milliseconds for the 262144 x 640 head (51865 x 512 in brackets):

    rows                      1            2           5           8           12
    states @ columns       28 (4.2)    62 (8.6)   114 (12.3)  121 (12.1)  131 (14.7)
    (weight @ states.T).T  47 (7.7)    31 (5.0)    46 (7.0)    72 (10.0)  168 (25.1)
    F.linear               47 (7.4)    93 (14.8)   89 (12.6)   93 (20.3)  112 (16.6)

so one row goes through the transposed copy and 2-8 rows through the weight as it is stored,
which makes a 5-token verification 2.5x cheaper than either layout alone. 9-17 rows (up to 16
drafts and the bonus row) go through the stored weight in balanced parts of at most 8 rows. With
2 threads that is clearly faster for the large head, milliseconds, median of 9 runs:

    rows                      9     12     13     16     17
    states @ columns        132    101    109    107    110
    weight @ parts            41     61     68     71     82
    F.linear                  95     77     94     87    109

and within noise for Whisper's (12-17 rows: 10-14 ms either way); with one thread, 13-17 rows
are within noise (134-171 against 139-163 ms). Beyond 17 rows the parts lose and the transposed
copy is used. Both layouts give the same values up to float rounding, as any two BLAS kernels do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Row counts for which (weight @ states.T).T, in parts of at most _PART_ROWS rows, beats
# states @ columns on CPU (table above).
_ROW_MAJOR_ROWS = range(2, 18)
_PART_ROWS = 8


class OutputProjection:
    """states @ weight.T (+ bias) for an output head; weight: Tensor, shape = (vocab, d_model).

    Keeps the weight as given (shared with the model, no copy) and, on CPU, a transposed copy,
    (d_model, vocab), made here: made on the first single-row call instead, it cost a decoding
    step about 2.5 s for Gemma's head (670 MB), which also misled the adaptive policy's
    measured price of plain steps.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight = weight.detach()
        self.bias = None if bias is None else bias.detach()
        on_cpu = self.weight.device.type == "cpu"
        self._columns = self.weight.T.contiguous() if on_cpu else None

    @property
    def vocabulary_size(self) -> int:
        return self.weight.shape[0]

    def __call__(self, states: torch.Tensor) -> torch.Tensor:
        """states: Tensor, shape = (..., d_model) -> Tensor, shape = (..., vocab)."""
        if states.device.type != "cpu":  # GPU BLAS handles skinny products in any layout
            return F.linear(states, self.weight, self.bias)
        flat = states.reshape(-1, states.shape[-1])
        rows = flat.shape[0]
        if rows in _ROW_MAJOR_ROWS:
            parts = flat.tensor_split(-(-rows // _PART_ROWS))
            # (rows, vocab) views with transposed strides; one part needs no copy
            products = [(self.weight @ part.T).T for part in parts]
            product = products[0] if len(products) == 1 else torch.cat(products)
        else:
            product = flat @ self._columns
        if self.bias is not None:
            product = product + self.bias
        return product.reshape(*states.shape[:-1], self.vocabulary_size)
