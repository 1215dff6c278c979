"""The prompt set (templates × topics, and held-out topics) and the sampling helpers that `training.features`
generates the target's own answers with.

The prompts are templates x topics (explanations, code, stories, lists, QA, ...); the held-out topics are never
trained on, so every proposer is measured on the same held-out answers.
"""

from __future__ import annotations

import hashlib
import random

import torch

TEMPLATES = [
    "Explain {t} in simple terms.",
    "Write a short story about {t}.",
    "Give me a list of five interesting facts about {t}.",
    "What are the pros and cons of {t}?",
    "Write a Python function related to {t}, with a docstring and an example.",
    "Write a short poem about {t}.",
    "How would you explain {t} to a ten-year-old?",
    "Summarize the history of {t} in a paragraph.",
    "What are common misconceptions about {t}?",
    "Write a step-by-step guide to getting started with {t}.",
    "Compare {t} with something similar and explain the differences.",
    "Write an email to a friend recommending {t}.",
    "What questions should a beginner ask about {t}? Answer three of them.",
    "Describe a typical day of someone who works with {t}.",
    "Write a dialogue between a teacher and a student about {t}.",
    "List the key terms someone should know about {t}, with one-line definitions.",
    "Why is {t} important? Give three reasons.",
    "Write a product description for a book about {t}.",
    "What would the world look like without {t}?",
    "Give a quiz of three multiple-choice questions about {t}, with answers.",
    "Write a tweet and a short blog introduction about {t}.",
    "What are the main challenges in {t} today?",
    "Tell me a joke about {t} and explain why it is funny.",
    "Write pseudocode or a small program that simulates {t}.",
]

TOPICS = [
    "photosynthesis",
    "black holes",
    "the French Revolution",
    "machine learning",
    "volcanoes",
    "the water cycle",
    "sorting algorithms",
    "climate change",
    "the human heart",
    "bees",
    "the Roman Empire",
    "electric cars",
    "chess",
    "coffee",
    "recursion",
    "the moon landing",
    "vaccines",
    "earthquakes",
    "jazz music",
    "the stock market",
    "renewable energy",
    "dinosaurs",
    "the internet",
    "gardening",
    "ancient Egypt",
    "sleep",
    "neural networks",
    "the solar system",
    "databases",
    "friendship",
    "soccer",
    "bread baking",
    "glaciers",
    "the printing press",
    "linked lists",
    "rainforests",
    "meditation",
    "cryptography",
    "the immune system",
    "robots",
    "origami",
    "hash tables",
    "the ocean",
    "volunteering",
    "public libraries",
    "the Olympic Games",
    "honey",
    "time management",
    "bicycles",
    "mountains",
    "the Great Wall of China",
    "electricity",
    "weather forecasting",
    "penguins",
    "video games",
    "recycling",
    "Shakespeare",
    "the periodic table",
    "trains",
    "mushrooms",
    "smartphones",
    "the Renaissance",
    "binary numbers",
    "deserts",
    "airplanes",
    "cats",
    "dogs",
    "space exploration",
    "learning a new language",
    "web browsers",
    "tea",
    "compound interest",
    "the Amazon river",
    "chocolate",
    "microscopes",
    "democracy",
    "musical instruments",
    "solar panels",
    "the Pythagorean theorem",
    "regular expressions",
    "spiders",
    "lighthouses",
    "camping",
    "the Industrial Revolution",
    "DNA",
    "fractions",
    "operating systems",
    "tornadoes",
    "museums",
    "pizza",
    "knitting",
    "satellites",
    "the Moon",
    "sharks",
    "first aid",
    "probability",
    "castles",
    "the Silk Road",
    "rivers",
    "unit testing",
    "birds migration",
    "paper money",
    "wind turbines",
    "yoga",
    "the Vikings",
    "plate tectonics",
    "git version control",
    "snow",
    "owls",
    "architecture",
    "vitamins",
]

# held-out topics: never used in training (evaluation prompts)
HELDOUT_TOPICS = [
    "octopuses",
    "the Eiffel Tower",
    "quantum computing",
    "marathon running",
    "ice cream",
    "the Mars rover",
    "sign language",
    "bridges",
    "coral reefs",
    "board games",
    "the telescope",
    "recursion in mathematics",
    "volcanic islands",
    "podcasts",
    "electric guitars",
    "the metric system",
]


def prompts(split: str = "train", seed: int = 0) -> list[str]:
    """All train prompts (templates x TOPICS) or held-out prompts (HELDOUT_TOPICS), shuffled."""
    topics = TOPICS if split == "train" else HELDOUT_TOPICS
    out = [tpl.format(t=t) for t in topics for tpl in TEMPLATES]
    if split != "train":  # a fixed, smaller held-out set: 3 templates per topic
        out = [p for p in out if int(hashlib.md5(p.encode()).hexdigest(), 16) % 8 < 3]
    random.Random(seed).shuffle(out)
    return out


class _NormHook:
    """Captures the output of a module (default: the target's final norm = its normed last
    hidden state)."""

    def __init__(self, module):
        self.outs: list[torch.Tensor] = []
        self.h = module.register_forward_hook(
            lambda m, i, o: self.outs.append((o[0] if isinstance(o, tuple) else o).detach())
        )

    def close(self):
        self.h.remove()


def _filter(logits: torch.Tensor, temperature: float, top_p: float, top_k: int = 200) -> tuple:
    """Sampling distribution over the top_k logits after temperature and top-p: (probs, ids)."""
    z, idx = torch.topk(logits.float(), top_k, dim=-1)  # sorted, descending
    p = torch.softmax(z / temperature, -1)
    if top_p < 1.0:
        drop = p.cumsum(-1) - p > top_p
        p = p.masked_fill(drop, 0.0)
    return p, idx


def left_padded(model, prompt_ids: list[list[int]], pad: int) -> tuple:
    """A batch of prompts left-padded on the target's device: (L, device, ids [B, L], mask [B, L], positions)."""
    B, L = len(prompt_ids), max(len(p) for p in prompt_ids)
    dev = next(model.parameters()).device  # the batch runs where the target is (CPU or a GPU)
    ids = torch.full((B, L), pad, dtype=torch.long)
    mask = torch.zeros((B, L), dtype=torch.long)
    for b, p in enumerate(prompt_ids):
        ids[b, L - len(p) :] = torch.tensor(p)
        mask[b, L - len(p) :] = 1
    ids, mask = ids.to(dev), mask.to(dev)
    return L, dev, ids, mask, (mask.cumsum(1) - 1).clamp_min(0)
