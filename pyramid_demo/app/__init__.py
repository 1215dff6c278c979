"""The Gradio app's logic: handlers, step inspector, plotly charts, HTML rendering, UI text (app.py: the layout)."""
