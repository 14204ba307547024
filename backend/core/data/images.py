"""The images of a dataset row: where each comes from, checked by its header, decoded on demand.

Sources: a path (relative to the data file), a `file://` URL, a `data:image/...;base64,` URI, or a
`datasets` Image cell ({"bytes", "path"}). `probe` reads the header only (Pillow's `Image.open` does
not decode), so a decompression bomb is refused from its stated size before a pixel is decoded;
`decode` loads every pixel (a truncated or corrupt file fails there) and converts the mode.

The mode conversion matches transformers 5's image processors: `load_image` applies the EXIF
orientation (`ImageOps.exif_transpose`), and `convert_to_rgb` (image_transforms.py, used when
`do_convert_rgb`) composites any transparency (an alpha band, or a palette's `transparency`) onto
white and converts everything else with `Image.convert("RGB")` (CMYK, L, P). One departure: a
16-bit grayscale image is scaled to 8 bits (value / 256), where `convert` would clip every value
above 255 to white. Torch-free; Pillow is imported when an image is first looked at.
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from backend.core.data.conversation import InvalidExample

MAX_PIXELS = 89_478_485
"""Pillow's own MAX_IMAGE_PIXELS (it warns above it and refuses at twice it); we refuse above it:
decoded as RGB such an image holds 256 MiB, and no vision processor keeps that resolution."""
ROTATED = (5, 6, 7, 8)
"""EXIF orientations that swap width and height."""


@dataclass(frozen=True)
class ImageRef:
    """One image of a row: a resolved file path, or the bytes of a data: URI or a Parquet cell."""

    label: str
    """How the data names it (the path as written, or "data: URI"): said in errors."""
    path: Path | None = None
    data: bytes | None = field(default=None, repr=False)
    width: int = 0
    height: int = 0
    """As the model will see it (EXIF orientation applied); 0 until probed."""
    mode: str = ""

    def open_bytes(self) -> Any:
        return io.BytesIO(self.data) if self.data is not None else self.path


def resolve(value: Any, base: Path) -> ImageRef:
    """A source as a record holds it -> an ImageRef (not opened yet); raises InvalidExample."""
    if isinstance(value, dict):  # a `datasets` Image cell, decode=False
        data, path = value.get("bytes"), value.get("path")
        if data:
            return ImageRef(str(path or "image bytes"), data=bytes(data))
        value = path
    if not isinstance(value, str) or not value.strip():
        raise InvalidExample("an image source that is not a path", detail=repr(value)[:80],
                             fix="give each image as a path, a file:// URL or a data:image/...;base64, URI")
    text = value.strip()
    if text.startswith("data:"):
        head, _, payload = text.partition(",")
        if not head.startswith("data:image/") or ";base64" not in head:
            raise InvalidExample("a data: URI that is not a base64 image", detail=head[:60],
                                 fix="write it as data:image/png;base64,...")
        try:
            return ImageRef("data: URI", data=base64.b64decode(payload, validate=True))
        except (binascii.Error, ValueError):
            raise InvalidExample("a data: URI whose base64 is broken", detail=head[:60],
                                 fix="encode the image again") from None
    if text.startswith("file://"):
        return ImageRef(text, path=Path(unquote(urlparse(text).path)))
    if "://" in text:
        raise InvalidExample("an image at a web address", detail=text[:80],
                             fix="download it and give its local path (the studio does not fetch data)")
    path = Path(text).expanduser()
    return ImageRef(text, path=path if path.is_absolute() else base / path)


def probe(ref: ImageRef) -> ImageRef:
    """The ref with its size and mode, from the header; refuses missing files and bombs."""
    if ref.path is not None:
        try:
            stat = ref.path.stat()
        except OSError:
            raise InvalidExample("a missing image", detail=ref.label,
                                 fix="put the image there (paths are relative to the data file)") from None
        if not ref.path.is_file():
            raise InvalidExample("an image path that is a folder", detail=ref.label, fix="name the image file")
        width, height, mode, rotated = _header_of_file(str(ref.path), stat.st_mtime_ns, stat.st_size, ref.label)
    else:
        width, height, mode, rotated = _header(ref.open_bytes(), ref.label)
    if rotated:
        width, height = height, width
    return ImageRef(ref.label, ref.path, ref.data, width, height, mode)


@lru_cache(maxsize=8192)
def _header_of_file(path: str, stamp: int, size: int, label: str) -> tuple[int, int, str, bool]:
    """Cached by the file's time and size: a second preview of the same data opens nothing."""
    return _header(path, label)


def _header(source: Any, label: str) -> tuple[int, int, str, bool]:
    image_module = _pillow()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", image_module.DecompressionBombWarning)
        try:
            with image_module.open(source) as image:
                width, height = image.size
                orientation = _orientation(image, image_module)
                mode = image.mode
        except image_module.DecompressionBombError as exc:
            stated = str(exc).split(" pixels")[0].split("(")[-1]  # Pillow's "Image size (N pixels) exceeds ..."
            raise _bomb(label, f"{int(stated):,} pixels" if stated.isdigit() else "its size") from None
        except image_module.UnidentifiedImageError:
            raise InvalidExample("an image file Pillow cannot read", detail=label,
                                 fix="save it as PNG or JPEG") from None
        except PermissionError:
            raise InvalidExample("an image that cannot be read (permission denied)", detail=label,
                                 fix="make it readable") from None
        except (OSError, SyntaxError, ValueError) as exc:
            raise InvalidExample("a corrupt image", detail=f"{label}: {exc}"[:160],
                                 fix="replace it with an intact copy") from None
    if width * height > MAX_PIXELS:
        raise _bomb(label, f"{width}x{height}")
    return width, height, mode, orientation in ROTATED


def _orientation(image: Any, image_module: Any) -> int | None:
    """The EXIF orientation from what the header gave, never `getexif()` on a PNG, which decodes the
    whole image looking for an eXIf chunk after the pixels (a bomb would be decoded)."""
    if image.format == "TIFF":
        return image.getexif().get(0x0112)
    raw = image.info.get("exif")
    if not raw:
        return None
    exif = image_module.Exif()
    try:
        exif.load(raw)
    except Exception:  # a broken EXIF block: the picture may still be fine, and upright
        return None
    return exif.get(0x0112)


def _bomb(label: str, size: str) -> InvalidExample:
    return InvalidExample(f"an image over {MAX_PIXELS:,} pixels, refused before decoding (a decompression bomb "
                          "guard)", detail=f"{label}, {size}",
                          fix="shrink it, to 8192x8192 or less")


def decode(ref: ImageRef) -> Any:
    """Every pixel loaded and converted to RGB as the processors expect; raises InvalidExample for
    a truncated or corrupt file. Call after `probe`, which refuses bombs first."""
    image_module = _pillow()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", image_module.DecompressionBombWarning)
        try:
            with image_module.open(ref.open_bytes()) as image:
                image.load()
                return to_rgb(image)
        except (OSError, SyntaxError, ValueError, image_module.DecompressionBombError) as exc:
            truncated = "truncated" in str(exc)
            raise InvalidExample("a truncated image" if truncated else "a corrupt image",
                                 detail=f"{ref.label}: {exc}"[:160],
                                 fix="replace it with an intact copy") from None


def to_rgb(image: Any) -> Any:
    """EXIF orientation applied, 16-bit scaled to 8, transparency on white, then RGB (see the module)."""
    from PIL import ImageOps

    image = ImageOps.exif_transpose(image)
    if image.mode.startswith("I"):  # I;16, I;16B, I: 16-bit (or 32-bit) grayscale
        image = image.convert("I").point(lambda value: value * (1 / 256)).convert("L")
    if image.mode == "RGB":
        return image
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        image_module = _pillow()
        rgba = image.convert("RGBA")
        white = image_module.new("RGBA", rgba.size, (255, 255, 255, 255))
        return image_module.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def _pillow() -> Any:
    try:
        from PIL import Image
    except ImportError:
        raise InvalidExample("images, which need the Pillow package", fix="pip install pillow") from None
    return Image
