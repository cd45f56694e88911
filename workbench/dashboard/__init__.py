"""The Streamlit dashboard (app.py and its pages in views/), shipped as package data: `workbench dashboard`."""
