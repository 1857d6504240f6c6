"""Synthetic parcel-delivery data and the tables' schema."""
