"""Networks written the way a user writes their own, as model factories (`model="module:factory"`):
they go through the same path as a practitioner's model, and every rank, test and exercise can
import them. `gpt2_style`: GPT-2's layout and parameter names (the audit exercise)."""
