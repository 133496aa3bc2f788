"""The jobs the stage scripts run.

Convert the draft, build the chat data, fetch models, pin the image's stack, publish the
trained draft, combine the serve checks.
"""
