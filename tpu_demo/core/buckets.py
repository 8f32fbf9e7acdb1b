"""Resolution buckets: the fixed set of static shapes a model serves.

One bucket is one static shape, so one compiled graph. Requests name a bucket as "WIDTHxHEIGHT".
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_BUCKET_PATTERN = re.compile(r"^\s*(\d{1,5})\s*[xX\u00d7]\s*(\d{1,5})\s*$")


class BucketError(ValueError):
    """A resolution that is not a valid "WIDTHxHEIGHT" bucket."""


@dataclass(frozen=True, order=True)
class Bucket:
    width: int
    height: int

    @classmethod
    def parse(cls, text: str, multiple_of: int = 16) -> "Bucket":
        """Parse "WIDTHxHEIGHT"; both sides positive multiples of ``multiple_of``."""
        match = _BUCKET_PATTERN.match(str(text))
        if not match:
            raise BucketError(f"resolution {str(text)[:40]!r} is not of the form WIDTHxHEIGHT, e.g. 1024x1024")
        bucket = cls(int(match.group(1)), int(match.group(2)))
        if min(bucket.width, bucket.height) < multiple_of or bucket.width % multiple_of or bucket.height % multiple_of:
            raise BucketError(f"resolution {bucket} must have both sides positive multiples of {multiple_of}")
        return bucket

    def __str__(self) -> str:
        return f"{self.width}x{self.height}"

    @property
    def aspect_ratio(self) -> str:
        """Reduced ratio for labels, e.g. "16:9"; close ratios are named by the nearest common one."""
        divisor = math.gcd(self.width, self.height)
        exact = (self.width // divisor, self.height // divisor)
        if max(exact) <= 21:
            return f"{exact[0]}:{exact[1]}"
        value = self.width / self.height
        common = [(1, 1), (4, 3), (3, 4), (3, 2), (2, 3), (16, 9), (9, 16), (21, 9), (9, 21), (5, 4), (4, 5)]
        w, h = min(common, key=lambda ratio: abs(ratio[0] / ratio[1] - value))
        return f"~{w}:{h}"

    @property
    def label(self) -> str:
        """Dropdown label: "1:1 · 1024x1024"."""
        return f"{self.aspect_ratio} \u00b7 {self}"


def parse_bucket_list(text: str, multiple_of: int = 16) -> tuple[Bucket, ...]:
    """Parse "64x64,128x96" into unique buckets, keeping their order."""
    items = [item for item in str(text).split(",") if item.strip()]
    if not items:
        raise BucketError("the bucket list is empty; give e.g. 64x64,128x96")
    buckets: list[Bucket] = []
    for item in items:
        bucket = Bucket.parse(item, multiple_of)
        if bucket not in buckets:
            buckets.append(bucket)
    return tuple(buckets)


#: static batch sizes (images per pipeline call): each warm one is one more graph per bucket
BATCH_SIZES: tuple[int, ...] = (1, 2, 4)
