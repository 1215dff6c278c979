"""The Gradio app's logic: handlers, step inspector, plotly charts, HTML rendering and UI text
(app.py holds the layout)."""
