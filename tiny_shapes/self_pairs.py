"""Self-pairs: the model's own starting noise paired with the scene it drew from it.

Rectified flow's *reflow* (Liu et al. 2022) retrains a model on pairs (noise, the sample its own
ODE reached from that noise), so the paths straighten and the noise decides the result. Here the
pairs are filtered by the strict judge: only a noise from which the model drew every named
attribute right, and one object per object the caption names, is kept, paired with the scene it
drew rendered exactly (the layout the judge read for what the caption left out). Training on
them teaches the model to commit to the layout its noise already leaned towards, instead of the
average of the layouts a left-out caption allows (the copies of docs/tiny-shapes.md).

A kept scene must be one the training scenes could be: no held-out (colour, shape, position)
triple (the evaluation's prompts are built from those), two objects never at one place, and a
centre object only beside small ones.
"""

from __future__ import annotations

from dataclasses import replace

from tiny_shapes.captions import Prompt
from tiny_shapes.dataset import BACKGROUNDS, POSITION_NAMES, SIZES, Scene, is_held_out
from tiny_shapes.judge import find_objects
from tiny_shapes.prompt_judge import match_objects


def drawn_scene(prompt: Prompt, layout: tuple) -> Scene | None:
    """``prompt``'s scene with what it left out set to ``layout`` (``judge_prompt``'s reading, in its
    order: per object the position then the size when left out, then the background), or None
    when the reading is incomplete or not a scene training could draw."""
    seen = list(layout)
    objects = []
    for i, obj in enumerate(prompt.scene.objects):
        values = {}
        for attribute in ("position", "size"):
            if not prompt.names(i, attribute):
                values[attribute] = seen.pop(0) if seen else None
        objects.append(replace(obj, **values))
    background = prompt.scene.background if prompt.background_named else (seen.pop(0) if seen else None)
    scene = Scene(background, tuple(objects))
    return scene if is_trainable(scene) else None


def repaired_scene(prompt: Prompt, image) -> Scene | None:
    """For an image the judge failed (copies, most often): ``prompt``'s scene with what it left out
    taken from the most prominent object of each named colour (``find_objects`` finds the largest
    first; the caption's named position decides among copies when it names one), or None.

    The noise is then paired with one of the objects the model hedged between: reflow towards a
    single object where the model drew several (``--repair`` of scripts/make_self_pairs.py)."""
    background, objects = find_objects(image)
    found = match_objects(prompt, objects, image.size)
    if any(obj is None for obj in found):
        return None
    # the same reading drawn_scene takes from the judge: per object position then size, then the background
    layout = [getattr(seen, attribute) for i, seen in enumerate(found) for attribute in ("position", "size")
              if not prompt.names(i, attribute)]
    return drawn_scene(prompt, tuple(layout) + (() if prompt.background_named else (background,)))


def is_trainable(scene: Scene) -> bool:
    """Whether ``sample_scene`` could have drawn ``scene`` (see the module docstring)."""
    if scene.background not in BACKGROUNDS:
        return False
    positions = [obj.position for obj in scene.objects]
    if any(p not in POSITION_NAMES for p in positions) or any(obj.size not in SIZES for obj in scene.objects):
        return False
    if len(set(positions)) < len(positions):
        return False
    if len(positions) > 1 and "center" in positions and any(obj.size != "small" for obj in scene.objects):
        return False
    return all(obj.colour != scene.background and not is_held_out(obj.colour, obj.shape, obj.position)
               for obj in scene.objects)


def kept_prompt(prompt: Prompt, scene: Scene) -> Prompt:
    """The same caption, now describing the scene the model drew."""
    return replace(prompt, scene=scene)
