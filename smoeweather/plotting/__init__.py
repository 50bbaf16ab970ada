"""smoeweather.plotting"""
